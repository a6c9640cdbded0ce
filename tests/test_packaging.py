"""pyproject.toml and environment.yml describe the same environment; CI and notebooks are
set up as the conventions (docs/writing.md) say."""
import json
import pathlib
import re
import tomllib

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted((ROOT / "chapters").glob("*.ipynb"))


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
    """environment.yml = dependencies + the test extra, which includes the book extra."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert f"{project['name']}[book]" in project["optional-dependencies"]["test"]
    wanted = set(project["dependencies"]) | extra(project, "test")
    assert extra(project, "book") <= wanted
    listed = environment_pip_list()
    assert "-e ." in listed
    assert set(listed) - {"-e ."} == wanted
    assert "python=3.11" in (ROOT / "environment.yml").read_text()


def test_ci_runs_the_readme_commands_in_smoke_mode():
    ci = (ROOT / ".ci/run").read_text()
    readme = (ROOT / "README.md").read_text()
    assert "D2L_MULTI_SMOKE=1" in ci and "D2L_MULTI_DATA" in ci
    assert 'pip install -q -e ".[test]"' in ci and 'pip install -e ".[test]"' in readme
    assert "python -m pytest -n 2" in ci and "python -m pytest -n 2" in readme
    assert "python -m d2l_multi train" in readme


def test_notebooks_have_no_outputs():
    assert NOTEBOOKS
    for nb in NOTEBOOKS:
        for i, cell in enumerate(json.loads(nb.read_text())["cells"]):
            if cell["cell_type"] == "code":
                assert not cell["outputs"], f"{nb.name} cell {i} has outputs: strip them"
                assert cell["execution_count"] is None, f"{nb.name} cell {i} has a count"


def test_notebooks_set_up_devices_first_and_end_with_solutions():
    for nb in NOTEBOOKS:
        cells = json.loads(nb.read_text())["cells"]
        code = ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]
        first = code[0]
        assert "simulate_devices(" in first and "d2l.smoke()" in first, nb.name
        before = first[:first.index("simulate_devices(")]
        assert "import jax" not in before.replace("import d2l_multi", ""), nb.name
        text = "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        for heading in ("## Summary", "## Exercises", "## Solutions"):
            assert heading in text, f"{nb.name} lacks {heading}"
        solutions = max(i for i, c in enumerate(cells) if "## Solutions" in "".join(c["source"]))
        assert any(c["cell_type"] == "code" for c in cells[solutions:]), nb.name


def test_solutions_come_last_in_a_collapsed_heading_cell_of_their_own():
    """docs/writing.md: Summary, Exercises, [References], Solutions; the heading alone in a
    cell that JupyterLab opens collapsed (tools/nb.py solutions fixes a notebook)."""
    for nb in NOTEBOOKS:
        cells = json.loads(nb.read_text())["cells"]
        headings = [(i, line.rstrip()) for i, c in enumerate(cells) if c["cell_type"] == "markdown"
                    for line in "".join(c["source"]).splitlines() if re.match(r"## \S", line)]
        names = [h for _, h in headings]
        assert names[-1] == "## Solutions", f"{nb.name}: the last ## heading is {names[-1]!r}"
        tail = [h for h in names if h in ("## Summary", "## Exercises", "## References")]
        assert tail[-2:] in (["## Summary", "## Exercises"], ["## Exercises", "## References"]), (
            f"{nb.name}: end with ## Summary, ## Exercises, [## References], ## Solutions")
        i = headings[-1][0]
        cell = cells[i]
        assert "".join(cell["source"]).strip() == "## Solutions", (
            f"{nb.name} cell {i}: put '## Solutions' in a cell of its own "
            f"(python tools/nb.py solutions chapters/{nb.name})")
        assert cell["metadata"].get("jp-MarkdownHeadingCollapsed") is True, (
            f"{nb.name} cell {i}: mark the Solutions heading collapsed "
            f"(python tools/nb.py solutions chapters/{nb.name})")


def test_notebooks_never_read_data_through_the_working_directory():
    for nb in NOTEBOOKS:
        for cell in json.loads(nb.read_text())["cells"]:
            src = "".join(cell["source"])
            if cell["cell_type"] == "code":
                assert "../shared" not in src and "shared/data" not in src, nb.name
