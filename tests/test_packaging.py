"""pyproject.toml and environment.yml describe the same environment; CI and notebooks are
set up as the conventions (docs/writing.md) say."""
import pathlib
import re
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


def test_ci_runs_the_readme_commands_in_smoke_mode():
    ci = (ROOT / ".ci/run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "D2L_MULTI_SMOKE=1" in ci and "D2L_MULTI_DATA" in ci
    assert 'pip install -q -e ".[test]"' in ci and 'pip install -e ".[test]"' in readme
    assert "python -m pytest -n 2" in ci and "python -m pytest -n 2" in readme
    assert "python -m d2l_multi train" in readme
