"""The notebooks meet the chapter's writing standard (docs/writing.md): one class each, the
same first cell, no scaffolding in the cells a reader copies, runnable #@save cells, the end
matter in order with the solutions folded, nothing about how the book was made, and stored
outputs from a full run of the current code (``python -m d2l_multi book --rerun``)."""
import ast
import json
import os
import pathlib
import re
import subprocess
import sys
import tomllib

import nbformat
import pytest

from d2l_multi import commands
from d2l_multi.commands import book

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


def freshness(path):
    """None, or one line naming the notebook at ``path``, why its stored outputs are stale,
    and the command that refreshes them."""
    reason = book.stale(json.loads(pathlib.Path(path).read_text()))
    if reason is None:
        return None
    return f"{path.name}: {reason}; refresh it: {book.REFRESH} chapters/{path.name}"


@params
def test_stored_outputs_are_those_of_a_full_run_of_the_current_code(nb):
    """Every notebook is committed with the outputs of a full (not smoke) run of its current
    code cells, none of them an error: a notebook edited without refreshing fails here."""
    message = freshness(nb)
    assert message is None, message


DRAWS = re.compile(r"\bplt\.|\bd2l\.(plot|Animator)\b|\.plot\(")


@params
def test_a_notebook_that_draws_stores_its_charts(nb):
    """A reader of the stored outputs (GitHub, the book) sees every chart the code draws."""
    cells = json.loads(nb.read_text())["cells"]
    if not any(DRAWS.search("".join(c["source"])) for c in cells if c["cell_type"] == "code"):
        pytest.skip("draws no chart")
    images = [o for c in cells for o in c.get("outputs", [])
              if {"image/png", "image/svg+xml"} & set(o.get("data", {}))]
    assert images, f"{nb.name} draws charts but stores none: refresh it ({book.REFRESH})"


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


# The freshness check itself, on a small notebook in a temporary folder.

def small_notebook(path, *cells):
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell("# A small notebook")] + [
        nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    nbformat.write(nb, path)
    return path


SMALL = ("print(6 * 7)", "import os\nprint('smoke:', os.environ.get('D2L_MULTI_SMOKE'))",
         "import matplotlib.pyplot as plt\nplt.plot([1, 2]);")


@pytest.fixture(scope="module")
def refreshed(tmp_path_factory):
    """A small notebook after a full refresh, and the seconds the refresh reported."""
    path = small_notebook(tmp_path_factory.mktemp("fresh") / "small.ipynb", *SMALL)
    seconds = book.refresh_notebook(path)
    return path, seconds


@pytest.fixture
def fresh(refreshed, tmp_path):
    copy = tmp_path / refreshed[0].name
    copy.write_bytes(refreshed[0].read_bytes())
    return copy


def edit(path, change):
    nb = json.loads(path.read_text())
    change(nb)
    path.write_text(json.dumps(nb, indent=1))


def test_a_refreshed_notebook_holds_its_outputs_and_the_record_of_a_full_run(refreshed):
    path, seconds = refreshed
    nb = nbformat.read(path, as_version=4)
    printed = ["".join(o.get("text", "") for o in c.outputs) for c in nb.cells[1:]]
    assert printed == ["42\n", "smoke: None\n", ""]  # a full run, whatever the tests' switch
    # the chart is stored for readers, though the tests run with MPLBACKEND=Agg
    assert os.environ["MPLBACKEND"] == "Agg"
    assert any("image/png" in o.get("data", {}) for o in nb.cells[3].outputs)
    run = nb.metadata["d2l_multi"]["run"]
    assert run["smoke"] is False and run["code_hash"] == book.code_hash(nb)
    assert run["seconds"] == round(seconds, 1) and run["versions"].startswith("python 3.")
    assert " cores, load average " in run["machine"] and run["date"].endswith("+00:00")
    assert freshness(path) is None and not list(path.parent.glob(".*refreshing"))


def test_a_notebook_whose_code_changed_after_its_refresh_is_stale(fresh):
    edit(fresh, lambda nb: nb["cells"][1].update(source="print(6 * 9)"))
    assert freshness(fresh) == (
        "small.ipynb: its code cells changed after its outputs were computed; refresh it: "
        "python -m d2l_multi book --rerun chapters/small.ipynb")


def test_prose_and_line_ends_do_not_make_a_notebook_stale(fresh):
    edit(fresh, lambda nb: nb["cells"][0].update(source="# A small notebook, reworded"))
    edit(fresh, lambda nb: nb["cells"][2].update(
        source=["import os\r\n", "print('smoke:', os.environ.get('D2L_MULTI_SMOKE'))\n"]))
    assert freshness(fresh) is None


def test_a_stored_error_output_is_refused(fresh):
    error = nbformat.v4.new_output("error", ename="AssertionError", evalue="", traceback=[])
    edit(fresh, lambda nb: nb["cells"][2]["outputs"].append(error))
    assert freshness(fresh).startswith("small.ipynb: code cell 1 holds an error output "
                                       "(AssertionError); refresh it: ")


def test_outputs_of_another_run_and_missing_outputs_are_refused(fresh, tmp_path):
    edit(fresh, lambda nb: nb["cells"][1]["outputs"][0].update(text="41\n"))
    assert "its outputs changed after the full run that recorded them" in freshness(fresh)
    edit(fresh, lambda nb: nb["metadata"].pop("d2l_multi"))
    assert "no record of the run its outputs come from" in freshness(fresh)
    bare = small_notebook(tmp_path / "bare.ipynb", *SMALL)
    assert "bare.ipynb: no stored outputs; refresh it" in freshness(bare)


def test_the_outputs_of_a_smoke_run_are_refused(tmp_path):
    path = small_notebook(tmp_path / "small.ipynb", *SMALL)
    book.refresh_notebook(path, smoke=True)
    nb = nbformat.read(path, as_version=4)
    assert nb.cells[2].outputs[0]["text"] == "smoke: 1\n"
    assert nb.metadata["d2l_multi"]["run"]["smoke"] is True
    assert "its outputs come from a smoke run" in freshness(path)


def test_a_notebook_that_fails_keeps_its_old_file_and_the_command_names_it(
        tmp_path, refreshed, capsys):
    """``book --rerun`` refreshes the named notebooks; one that fails is left as it was (the
    others are refreshed), the command names it, exits 1 and builds no book."""
    chapters = tmp_path / "chapters"
    chapters.mkdir()
    good = small_notebook(chapters / "good.ipynb", *SMALL)
    bad = small_notebook(chapters / "bad.ipynb", "print('before')", "assert 1 + 1 == 3")
    old = (chapters / "old.ipynb")
    old.write_bytes(refreshed[0].read_bytes())
    edit(old, lambda nb: nb["cells"][2].update(source="1 / 0"))
    before = {p.name: p.read_bytes() for p in (bad, old)}
    status = commands.main(["book", "--rerun", "--chapters", str(chapters), str(old), str(bad),
                            str(good)])
    err = capsys.readouterr().err
    assert status == 1
    assert "2 notebook(s) failed and keep their old outputs: old, bad" in err
    assert "ZeroDivisionError" in err and "AssertionError" in err
    assert {p.name: p.read_bytes() for p in (bad, old)} == before
    assert freshness(good) is None and not (tmp_path / "_build" / "html").exists()
    assert sorted(p.name for p in chapters.iterdir()) == ["bad.ipynb", "good.ipynb", "old.ipynb"]


def test_the_command_refreshes_only_the_named_notebooks_then_builds_the_book(
        tmp_path, monkeypatch, capsys):
    chapters = tmp_path / "chapters"
    chapters.mkdir()
    named, other = (small_notebook(chapters / f"{n}.ipynb", *SMALL) for n in ("a", "b"))
    untouched = other.read_bytes()
    built = []
    monkeypatch.setattr(book, "build_book", lambda *args, **kwargs: (
        built.append((args, kwargs)) or (tmp_path / "html" / "index.html", [])))
    assert commands.main(["book", "--rerun", "--chapters", str(chapters), str(named)]) == 0
    assert freshness(named) is None and other.read_bytes() == untouched
    assert built[0][0][1:3] == ("stored", chapters.resolve())  # the stored outputs
    out = capsys.readouterr().out
    assert "a: refreshed in " in out and "b:" not in out


@pytest.mark.parametrize("argv,message", [
    (["chapters/00_devices.ipynb"], "NOTEBOOKs are refreshed by --rerun alone"),
    (["--smoke", "--rerun", "chapters/00_devices.ipynb"], "refreshed by --rerun alone"),
    (["--rerun", "chapters/missing.ipynb"], "NOTEBOOK chapters/missing.ipynb is not a notebook"),
])
def test_the_command_refuses_notebooks_it_would_not_refresh(argv, message, capsys):
    assert commands.main(["book", *argv]) == 2
    assert message in capsys.readouterr().err


def test_nbmake_neither_writes_into_the_notebooks_nor_minds_their_stored_outputs(fresh):
    """CI executes every notebook with nbmake (smoke mode, the configuration of
    pyproject.toml): a stored error output does not fail the run, and the file is not
    rewritten."""
    root = pathlib.Path(__file__).resolve().parent.parent
    addopts = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["pytest"][
        "ini_options"]["addopts"]
    assert "--nbmake" in addopts and "--overwrite" not in addopts
    error = nbformat.v4.new_output("error", ename="AssertionError", evalue="", traceback=[])
    edit(fresh, lambda nb: nb["cells"][2]["outputs"].append(error))
    before = fresh.read_bytes()
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", str(root / "pyproject.toml"), "--rootdir",
         str(fresh.parent), "-q", "-p", "no:xdist", str(fresh)],
        capture_output=True, text=True, timeout=300, cwd=fresh.parent)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 passed" in result.stdout and fresh.read_bytes() == before
