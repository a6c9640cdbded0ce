"""pyproject.toml and environment.yml describe the same environment; the commands that the
README and CI name exist."""
import pathlib
import re
import subprocess
import sys
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent


def environment_pip_list():
    lines = (ROOT / "environment.yml").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "- pip:")
    deps = []
    for line in lines[start + 1:]:
        m = re.match(r"^\s+- (.+)$", line)
        if not m:
            break
        deps.append(m.group(1).strip())
    return deps


def extra(project, name):
    """The requirements of an extra, with this project's own extras (d2l-multi[book]) expanded."""
    reqs = set()
    for req in project["optional-dependencies"][name]:
        m = re.fullmatch(rf"{project['name']}\[(.+)\]", req)
        reqs |= set().union(*(extra(project, e) for e in m.group(1).split(","))) if m else {req}
    return reqs


def test_environment_yml_lists_the_same_dependencies_as_pyproject():
    """environment.yml = dependencies + the test extra, which includes the book extra and the
    classroom extra (the tests build the student edition and grade submissions)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for name in ("book", "classroom"):
        assert f"{project['name']}[{name}]" in project["optional-dependencies"]["test"]
    wanted = set(project["dependencies"]) | extra(project, "test")
    assert extra(project, "book") | extra(project, "classroom") <= wanted
    listed = environment_pip_list()
    assert "-e ." in listed and "-c constraints.txt" in listed
    assert set(listed) - {"-e .", "-c constraints.txt"} == wanted
    assert "python=3.11" in (ROOT / "environment.yml").read_text()


def test_the_commands_that_readme_and_ci_name_exist():
    """Every ``python -m d2l_multi ...`` command the README, docs/ and .ci/run name answers
    --help, every extra they install exists, and .ci/run is valid bash."""
    text = "".join(p.read_text() for p in [ROOT / "README.md", ROOT / ".ci/run",
                                           *sorted((ROOT / "docs").glob("*.md"))])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = set(re.findall(r'pip install (?:-q )?-e "\.\[(\w+)\]"', text))
    assert extras and extras <= set(project["optional-dependencies"]), extras
    commands = {tuple(c.split()) for c in re.findall(r"python -m (d2l_multi(?:\.\w+| \w+)?)",
                                                      text)}
    assert ("d2l_multi", "launch") in commands and ("d2l_multi.mp_train",) in commands
    for command in sorted(commands):
        result = subprocess.run([sys.executable, "-m", *command, "--help"], cwd=ROOT,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, (command, result.stderr[-2000:])
    assert subprocess.run(["bash", "-n", str(ROOT / ".ci/run")]).returncode == 0


def test_relative_links_of_readme_and_docs_resolve():
    """A link from README.md or docs/*.md to a file of the repository names one that exists
    (renamed notebooks and moved pages leave no dead link behind)."""
    dead = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
                 *sorted((ROOT / "book").glob("*.md"))]:
        text = re.sub(r"`[^`\n]*`", "", page.read_text())  # examples in code are not links
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            path = target.split("#")[0]
            if not path or re.match(r"[a-z]+:", path):
                continue
            # the book stages book/ and chapters/ side by side: its pages link chapters/...
            where = [page.parent] + ([ROOT] if page.parent.name == "book" else [])
            if not any((base / path).exists() for base in where):
                dead.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not dead, dead
