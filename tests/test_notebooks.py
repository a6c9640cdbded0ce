"""The notebooks meet the chapter's writing standard (docs/writing.md): one class each, the
same first cell, no scaffolding in the cells a reader copies, runnable #@save cells, the end
matter in order with the solutions folded, and nothing about how the book was made."""
import ast
import json
import pathlib
import re

import pytest

CHAPTERS = pathlib.Path(__file__).resolve().parent.parent / "chapters"
NOTEBOOKS = sorted(CHAPTERS.glob("*.ipynb"))
FIRST_CELL = ("import d2l_multi as d2l\n"
              "d2l.simulate_devices(8)  # 8 CPU devices, unless there are 8+ "
              "accelerators\nimport jax\nimport jax.numpy as jnp")
# The notebooks that use one device ask for one: XLA:CPU's thread pool then fits the cores.
ONE_DEVICE = {"01_lenet_from_scratch", "A1_fast_lenet_on_cpu"}
FIRST_CELL_ONE = FIRST_CELL.replace("(8)  # 8 CPU devices, unless there are 8+ accelerators",
                                    "(1)  # one device: all this notebook uses")
SCAFFOLDING = re.compile(r"d2l\.(pick|smoke|shrink)\(|\bSMOKE\b|throttle|D2L_MULTI_SMOKE|"
                         r"block_until_ready\(.*\)\s*#.*(deadlock|queue)")
MAKING_OF = re.compile(r"\b(issue \d+|this session|the session|workplace|device tool|"
                       r"the targets? of|while writing this|authoring machine|in CI\b|"
                       r"smoke (mode|run|switch))", re.I)
params = pytest.mark.parametrize("nb", NOTEBOOKS, ids=lambda p: p.stem)


def cells(nb):
    return [(c["cell_type"], "".join(c["source"]), c) for c in json.loads(nb.read_text())["cells"]]


def markdown(nb):
    return "\n".join(src for kind, src, _ in cells(nb) if kind == "markdown")


def code(nb):
    return [src for kind, src, _ in cells(nb) if kind == "code"]


def test_there_are_notebooks():
    assert NOTEBOOKS


@params
def test_no_outputs_or_execution_counts(nb):
    for i, (kind, _, cell) in enumerate(cells(nb)):
        if kind == "code":
            assert not cell["outputs"] and cell["execution_count"] is None, (
                f"{nb.name} cell {i} has outputs: jupyter nbconvert --clear-output --inplace")


@params
def test_the_first_code_cell_sets_up_the_devices(nb):
    first = FIRST_CELL_ONE if nb.stem in ONE_DEVICE else FIRST_CELL
    assert code(nb)[0].strip().startswith(first), (
        f"{nb.name}: the first code cell must start with\n{first}")


@params
def test_class_sized(nb):
    words = len(re.findall(r"\w+", markdown(nb)))
    lines = [len([l for l in src.splitlines() if l.strip()]) for src in code(nb)]
    minutes = words / 200 + sum(lines) / 10
    assert minutes <= 35, f"{nb.name}: {minutes:.0f} reading minutes; split it"
    assert max(lines) <= 30, f"{nb.name}: a code cell of {max(lines)} lines (at most 30)"


@params
def test_no_scaffolding_in_the_cells(nb):
    for src in code(nb):
        assert not SCAFFOLDING.search(src), f"{nb.name}: scaffolding in a cell:\n{src[:300]}"
        assert "../shared" not in src and "shared/data" not in src, nb.name


@params
def test_the_chapter_speaks_only_of_its_subject(nb):
    for kind, src, _ in cells(nb):
        match = MAKING_OF.search(src)
        assert not match, f"{nb.name}: {src[max(0, match.start() - 60):match.end() + 60]!r}"


@params
def test_saved_cells_use_only_names_defined_before_them(nb):
    """Every #@save cell runs as written in notebook order (what chapter-check reports)."""
    from pyflakes.checker import Checker
    sources = [re.sub(r"(?m)^\s*[%!].*$", "", src) for src in code(nb)]
    for i, src in enumerate(sources):
        if not src.lstrip().startswith("#@save"):
            continue
        prefix = "\n".join(sources[:i])
        offset = prefix.count("\n") + 1 if prefix else 0
        tree = ast.parse(prefix + "\n" + src)
        undefined = sorted({m.message_args[0] for m in Checker(tree).messages
                            if type(m).__name__ == "UndefinedName" and m.lineno > offset})
        assert not undefined, f"{nb.name}: #@save cell {i} uses undefined {undefined}"


@params
def test_end_matter_in_order_with_the_solutions_folded(nb):
    """Summary, Exercises (3-5), [References], Solutions: the Solutions heading alone in a cell
    that JupyterLab opens collapsed (python tools/nb.py solutions fixes a notebook)."""
    all_cells = cells(nb)
    headings = [(i, line.rstrip()) for i, (kind, src, _) in enumerate(all_cells)
                if kind == "markdown" for line in src.splitlines() if re.match(r"## \S", line)]
    names = [h for _, h in headings]
    assert names[-1] == "## Solutions", f"{nb.name}: the last ## heading is {names[-1]!r}"
    tail = [h for h in names if h in ("## Summary", "## Exercises", "## References")]
    assert tail[-2:] in (["## Summary", "## Exercises"], ["## Exercises", "## References"]), (
        f"{nb.name}: end with ## Summary, ## Exercises, [## References], ## Solutions")
    i = headings[-1][0]
    _, src, cell = all_cells[i]
    assert src.strip() == "## Solutions" and cell["metadata"].get(
        "jp-MarkdownHeadingCollapsed") is True, (
        f"{nb.name} cell {i}: python tools/nb.py solutions chapters/{nb.name}")
    assert any(kind == "code" for kind, _, _ in all_cells[i:]), f"{nb.name}: no solution code"
    exercises = markdown(nb).split("## Exercises")[1].split("\n## ")[0]
    count = len(re.findall(r"(?m)^\d+\. ", exercises))
    assert 3 <= count <= 5, f"{nb.name}: {count} exercises (3-5)"


@params
def test_references_section_when_citing(nb):
    text = markdown(nb)
    if "{cite" in text:
        assert "## References" in text and "{bibliography}" in text, (
            f"{nb.name} cites but has no References section (docs/writing.md)")
