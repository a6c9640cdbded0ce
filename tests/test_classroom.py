"""The chapter as class assignments (d2l_multi/classroom.py, docs/classroom.md): the book's
notebooks become nbgrader's format; the student edition holds no solution text and its checks
fail with one line; grading a folder of submissions gives per-exercise scores in a CSV, a
notebook that raises or loops losing only the exercises affected, and nothing a submission
does reaching another's score or the teacher's files."""
import ast
import csv
import hashlib
import json
import os
import pathlib
import re
import subprocess
import sys
import zipfile

import nbformat
import pytest
from nbclient import NotebookClient

from d2l_multi import exercises
from d2l_multi.commands import classroom

ROOT = pathlib.Path(__file__).resolve().parent.parent
PRACTICE = ROOT / "tests" / "classroom" / "practice.ipynb"
CHAPTERS = sorted((ROOT / "chapters").glob("*.ipynb"))


def command(*args, timeout=600):
    return subprocess.run([sys.executable, "-m", "d2l_multi", "classroom", *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


def cells(path):
    return json.loads(pathlib.Path(path).read_text())["cells"]


def source(cell):
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


# ----- the converter ------------------------------------------------------------------------

def test_an_answer_keeps_signatures_docstrings_imports_and_value_names():
    src = ('import numpy as np\n\ndef helper(x):\n    return x + 1\n\n'
           '@staticmethod\ndef f(x, k):\n    """Doc."""\n    # a hint\n    return helper(x) * k\n\n'
           'spec = P(\'data\',\n         None)\nprint(f(1, 2))')
    marked = classroom.mark_answer(src, {"f", "spec"})
    assert marked == ('import numpy as np\n\n### BEGIN SOLUTION\ndef helper(x):\n    return x + 1'
                      '\n### END SOLUTION\n\n@staticmethod\ndef f(x, k):\n    """Doc."""\n'
                      '    ### BEGIN SOLUTION\n    # a hint\n    return helper(x) * k\n'
                      '    ### END SOLUTION\n\nspec = (\n    ### BEGIN SOLUTION\n'
                      '    P(\'data\',\n             None)\n    ### END SOLUTION\n)\n'
                      '### BEGIN SOLUTION\nprint(f(1, 2))\n### END SOLUTION')
    ast.parse(marked)
    assert classroom.mark_answer("def g(a,\n      b):\n    # how\n    return a", {"g"}) == (
        "def g(a,\n      b):\n    ### BEGIN SOLUTION\n    # how\n    return a\n"
        "    ### END SOLUTION")
    for bad, why in [("def f(x): return x", "on lines of its own"),
                     ("f, g = 1, 2", "assign each answer alone")]:
        with pytest.raises(classroom.ClassroomError, match=why):
            classroom.mark_answer(bad, {"f"})


def test_a_check_must_take_what_its_exercise_defines():
    nb = json.loads(PRACTICE.read_text())
    i = next(i for i, c in enumerate(nb["cells"]) if source(c).startswith("fsdp_spec ="))
    del nb["cells"][i]
    with pytest.raises(classroom.ClassroomError,
                       match=r"practice, exercise 3: fsdp_and_tensor_parallelism.fsdp_spec takes "
                             r"\['fsdp_spec'\]"):
        classroom.assignment(nb, "practice", exercises.CHECKS)


def test_the_teachers_notebook_has_the_solutions_and_hidden_tests():
    nb = classroom.assignment(json.loads(PRACTICE.read_text()), "practice", exercises.CHECKS)
    graded = [c for c in nb["cells"] if c["metadata"].get("nbgrader", {}).get("grade")
              and c["cell_type"] == "code"]
    assert [c["metadata"]["nbgrader"]["grade_id"] for c in graded] == [
        "ex1-broadcast", "ex2-balanced_stages", "ex3-fsdp_spec", "ex4-split_batch"]
    lines = source(graded[2]).split("\n")
    assert lines[:2] == ["from d2l_multi.exercises import fsdp_and_tensor_parallelism",
                         "### BEGIN HIDDEN TESTS"]
    assert lines[-2:] == ["### END HIDDEN TESTS",
                          "fsdp_and_tensor_parallelism.fsdp_spec(fsdp_spec)"]
    assert "hidden=True" not in source(graded[2])
    assert {c["metadata"]["nbgrader"]["points"] for c in graded} == {2}
    assert nb["metadata"]["d2l_multi"] == {"notebook": "practice"}


# ----- the student edition ------------------------------------------------------------------

@pytest.fixture(scope="module")
def course(tmp_path_factory):
    """The nbgrader course of the practice notebook, made by the command teachers run."""
    path = tmp_path_factory.mktemp("classroom") / "course"
    result = command("teacher", path, PRACTICE)
    assert result.returncode == 0, result.stderr
    return path


@pytest.fixture(scope="module")
def student_edition(tmp_path_factory):
    """The student edition of every notebook of the chapter and of the practice notebook."""
    out = tmp_path_factory.mktemp("classroom") / "student"
    result = command("student", out, *CHAPTERS, PRACTICE)
    assert result.returncode == 0, result.stderr
    return out


def given_lines(code):
    """Line numbers of a solution cell that a student is given: imports, function signatures
    and docstrings, and check calls."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return set()
    given = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom)) or (
                isinstance(stmt, ast.Expr) and re.match(r"\w+\.\w+\(", ast.unparse(stmt))):
            given |= set(range(stmt.lineno, stmt.end_lineno + 1))
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)):
            first = min([stmt.lineno] + [d.lineno for d in stmt.decorator_list])
            end = stmt.body[0].end_lineno if ast.get_docstring(stmt) else stmt.body[0].lineno - 1
            given |= set(range(first, end + 1))
    return given


def solution_text(path):
    """Lines of the book notebook's solutions that the student edition must not hold: its
    prose, and its code but for what a student is given."""
    book = cells(path)
    start = next(i for i, c in enumerate(book) if source(c).strip() == "## Solutions")
    before = "\n".join(source(c) for c in book[:start])  # the student keeps all of it
    lines = set()
    for cell in book[start + 1:]:
        text = source(cell)
        given = given_lines(text) if cell["cell_type"] == "code" else set()
        for number, line in enumerate(text.splitlines(), 1):
            line = line.strip()
            if cell["cell_type"] == "markdown":
                line = re.sub(r"^\*\*\d+\.\*\*\s*|^#+ .*", "", line)
            if number not in given and len(line) >= 12 and line not in before:
                lines.add(line)
    return lines


@pytest.mark.parametrize("path", CHAPTERS + [PRACTICE], ids=lambda p: p.stem)
def test_the_student_edition_has_no_solution_text(student_edition, path):
    given = student_edition / path.name
    text = given.read_text()
    student = json.loads(text)
    leaked = sorted(line for line in solution_text(path) if json.dumps(line)[1:-1] in text)
    assert not leaked, f"{path.name}: solution text in the student edition: {leaked[:3]}"
    book = cells(path)
    start = next(i for i, c in enumerate(book) if source(c).strip() == "## Solutions")
    assert [source(c) for c in student["cells"][:start]] == [source(c) for c in book[:start]]
    assert source(student["cells"][start]) == "## Answers"
    for image in re.findall(r"\]\((img/[^)]+)\)", "".join(source(c) for c in book)):
        assert (student_edition / image).is_file(), image


def test_the_students_wheel_holds_no_reference_answer_or_hidden_case(student_edition):
    (wheel,) = (student_edition / "wheel").glob("d2l_multi-*.whl")
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        text = "\n".join(z.read(n).decode(errors="replace") for n in names
                         if n.endswith(".py"))
    assert "d2l_multi/exercises/allreduce.py" in names
    assert not [n for n in names if "answer" in n or "grader" in n or n.startswith("tests/")]
    assert "hidden=True" not in text
    cases = [line.strip() for path in (ROOT / "classroom" / "grader").glob("*.py")
             for line in path.read_text().splitlines() if line.strip().startswith('"')]
    assert cases and not [line for line in cases if line in text]
    answers = (ROOT / "tests" / "exercise_answers.py").read_text()
    for line in ("x = x + lax.ppermute(x, axis_name, [(j, j ^ step) for j in range(k)])",
                 "splits.append((max(sum(costs[i:j]), slowest), (j - i, *counts)))"):
        assert line in answers and line not in text, line


def test_an_image_link_that_leaves_its_folder_is_refused(tmp_path):
    (tmp_path / "book" / "img").mkdir(parents=True)
    (tmp_path / "outside.txt").write_text("secret")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "![x](img/../../outside.txt)")])
    nbformat.write(nb, tmp_path / "book" / "nb.ipynb")
    result = command("student", tmp_path / "out", tmp_path / "book" / "nb.ipynb")
    assert result.returncode == 2 and "img/../../outside.txt" in result.stderr, result.stderr
    assert not (tmp_path / "out").exists()
    assert [p.name for p in tmp_path.rglob("outside.txt")] == ["outside.txt"]


def test_the_student_edition_runs_and_every_check_fails_with_one_line(student_edition):
    nb = nbformat.read(student_edition / PRACTICE.name, as_version=4)
    NotebookClient(nb, timeout=300, allow_errors=True, kernel_name="python3",
                   resources={"metadata": {"path": str(student_edition)}}).execute()
    checks = [c for c in nb.cells if c.cell_type == "code"
              and c.metadata.get("nbgrader", {}).get("grade")]
    assert len(checks) == 4
    for cell in checks:
        errors = [o for o in cell.outputs if o.output_type == "error"]
        assert len(errors) == 1 and errors[0].ename == "CheckFailed", cell.outputs
        assert len(errors[0].traceback) == 1 and errors[0].traceback[0].startswith("FAIL "), (
            errors[0].traceback)
    others = [o for c in nb.cells if c.cell_type == "code" and c not in checks
              for o in c.outputs if o.output_type == "error"]
    assert not others, others
    assert "Ellipsis" not in json.dumps([c.outputs for c in nb.cells if c.cell_type == "code"])


# ----- grading ------------------------------------------------------------------------------

def solved(course, grade_id):
    """The teacher's solution of an answer cell, as a student who solved it would write it."""
    nb = cells(course / "source" / "practice" / "practice.ipynb")
    cell = next(c for c in nb if c["metadata"].get("nbgrader", {}).get("grade_id") == grade_id)
    return "\n".join(line for line in source(cell).split("\n") if "SOLUTION" not in line)


def submission(course, answers):
    nb = json.loads((course / "release" / "practice" / "practice.ipynb").read_text())
    for cell in nb["cells"]:
        grade_id = cell["metadata"].get("nbgrader", {}).get("grade_id")
        if grade_id in answers:
            cell["source"] = answers[grade_id]
    return nb


def tree_digest(folder):
    digest = hashlib.sha256()
    for path in sorted(pathlib.Path(folder).rglob("*")):
        digest.update(str(path).encode())
        if path.is_file():
            digest.update(path.read_bytes())
    return digest.hexdigest()


SOLUTION = """\
def split_stages(costs, p):
    \"\"\"Blocks per stage, so that the slowest stage is fastest.\"\"\"
    best = None
    for cuts in itertools.combinations(range(1, len(costs)), p - 1):
        bounds = [0, *cuts, len(costs)]
        slowest = max(sum(costs[a:b]) for a, b in itertools.pairwise(bounds))
        if best is None or slowest < best[0]:
            best = (slowest, [b - a for a, b in itertools.pairwise(bounds)])
    return best[1]
"""
WRONG = "def split_stages(costs, p):\n    return [len(costs) // p] * (p - 1) + [\n" \
        "        len(costs) - (p - 1) * (len(costs) // p)]\n"


def tiny_notebook():
    """A notebook of one exercise whose check needs no JAX: quick to grade."""
    new = nbformat.v4
    nb = new.new_notebook(cells=[
        new.new_code_cell("import itertools\n\n"
                          "from d2l_multi.exercises import pipeline_parallelism as check"),
        new.new_markdown_cell("## Exercises\n\n1. Write `split_stages(costs, p)` and check "
                              "it with `check.balanced_stages(split_stages)`."),
        new.new_markdown_cell("## Solutions"),
        new.new_markdown_cell("**1.** Try every split into consecutive blocks."),
        new.new_code_cell(SOLUTION.rstrip()),
        new.new_code_cell("check.balanced_stages(split_stages)")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    return nb


HOSTILE = {
    # right, and it lists the processes it sees
    "good": SOLUTION + "import os\nprint('processes:', sorted(p for p in os.listdir('/proc') "
                       "if p.isdigit()))",
    "blank": None,  # the student edition as handed out
    "wrong": WRONG,
    # a wrong answer, and checks replaced, wrapped and monkeypatched
    "patcher": WRONG + "import d2l_multi.exercises._common as c\n"
               "from d2l_multi.exercises import pipeline_parallelism as pp\n"
               "pp.balanced_stages = lambda *a, **k: print('PASS balanced_stages: ok')\n"
               "check.balanced_stages = pp.balanced_stages\n"
               "c._replay = lambda *a, **k: (True, 'PASS')\n"
               "c._fail = lambda why: None\n",
    # a wrong answer that prints what a right one prints
    "faker": WRONG + "print('PASS balanced_stages: the slowest stage is as fast as any split "
                     "into consecutive blocks allows')\n",
    # looks for the course, the checkout's answers and the grader's files
    "reader": "import pathlib, d2l_multi\nfound = []\nfor p in {paths!r} + [str(pathlib.Path("
              "d2l_multi.__file__).parents[1] / 'tests' / 'exercise_answers.py')]:\n"
              "    try:\n        found.append(pathlib.Path(p).read_text()[:20])\n"
              "    except OSError:\n        pass\nprint('found:', len(found))\n" + WRONG,
    "forker": "import os, time\nfor _ in range(500):\n    if os.fork() == 0:\n"
              "        time.sleep(60)\n        os._exit(0)\n" + SOLUTION,
    "hog": "x = bytearray(8 * 2**30)\n" + SOLUTION,
    "looper": "while True:\n    pass\n" + SOLUTION,
    "stubborn": "import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\nwhile True:\n"
                "    pass\n" + SOLUTION,
}


@pytest.mark.slow
def test_grading_judges_behaviour_outside_the_sandboxed_kernel(tmp_path):
    """Hostile submissions: a replaced or monkeypatched check, a fake PASS line, reading the
    course's and the checkout's files, a fork bomb, a memory hog and endless loops (one that
    ignores the interrupt) score as their answers deserve (limits hit are named, the others
    graded); the kernel sees only its own processes; nbgrader's generate_feedback and export
    then work on the course."""
    from d2l_multi.commands import grading, sandbox
    if sandbox.available() or os.geteuid() != 0:
        pytest.skip(f"no bubblewrap sandbox here: {sandbox.available() or 'not root'}")
    source = tmp_path / "tiny.ipynb"
    nbformat.write(tiny_notebook(), source)
    course = classroom.teacher_course(tmp_path / "course", [source])
    subs = tmp_path / "subs"
    subs.mkdir()
    paths = [str(course / "grader" / "pipeline_parallelism.py"),
             str(course / "source" / "tiny" / "tiny.ipynb"), str(ROOT / "tests" /
                                                                   "exercise_answers.py")]
    for student, answer in HOSTILE.items():
        nb = json.loads((course / "release" / "tiny" / "tiny.ipynb").read_text())
        for cell in nb["cells"]:
            if answer and cell["metadata"].get("nbgrader", {}).get("grade_id") == "ex1-answer":
                cell["source"] = answer.format(paths=paths) if student == "reader" else answer
        (subs / f"{student}.ipynb").write_text(json.dumps(nb))
    (tmp_path / "roster.txt").write_text("good\nabsent\n")
    before = tree_digest(course / "grader")
    rows = grading.grade(course, subs, tmp_path / "out", timeout=20, roster=tmp_path /
                         "roster.txt", limits={"processes": 64, "memory": 3 * 2**30})
    got = {r[0]: r for r in rows if r[3] == "balanced_stages"}
    assert {s: (r[4], r[5], r[6]) for s, r in got.items()} == {
        "good": (1, 1, 2.0), "blank": (0, 0, 0.0), "wrong": (0, 0, 0.0),
        "patcher": (0, 0, 0.0), "faker": (0, 0, 0.0), "reader": (0, 0, 0.0),
        "forker": got["forker"][4:7], "hog": got["hog"][4:7], "looper": (0, 0, 0.0),
        "stubborn": (0, 0, 0.0)}
    assert got["looper"][8] == "fail" and "`split_stages` is not defined" in got["looper"][9]
    assert got["stubborn"][8] == "not graded" and "ignored the interrupt" in got["stubborn"][9]
    assert "equal numbers of blocks are not equal work" in got["faker"][9]
    assert "process limit hit (64 processes)" in got["forker"][9]
    assert "memory limit hit (3 GiB)" in got["hog"][9]
    assert ("absent", "tiny", "", "", 0, 0, 0.0, 0.0, "missing", "handed nothing in",
            "") in rows
    totals = {r[0]: r[6] for r in rows if r[3] == "total"}
    assert totals["good"] == 2.0 and totals["patcher"] == 0.0
    outputs = {s: json.dumps([c.get("outputs") for c in cells(
        course / "autograded" / s / "tiny" / "tiny.ipynb")]) for s in ("good", "reader")}
    procs = re.search(r"processes: \[([^\]]*)\]", outputs["good"]).group(1)
    assert len(procs.split(",")) <= 4, procs  # bwrap, its shell, the kernel
    assert "found: 0" in outputs["reader"]
    assert tree_digest(course / "grader") == before
    graded = (course / "autograded" / "good" / "tiny" / "tiny.ipynb").read_text()
    assert "b64decode" not in graded and "PASS balanced_stages" in graded
    for args in (["generate_feedback", "tiny"], ["export"]):
        result = subprocess.run([sys.executable, "-m", "nbgrader", *args], cwd=course,
                                capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-2000:]
    feedback = (course / "feedback" / "good" / "tiny" / "tiny.html").read_text()
    assert "PASS balanced_stages" in feedback and "b64decode" not in feedback
    with open(course / "grades.csv", newline="") as f:
        exported = list(csv.DictReader(f))
    assert {r["student_id"]: float(r["score"]) for r in exported}["good"] == 2.0


def test_bad_folders_are_refused_with_one_line(course, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
    (tmp_path / "bad.ipynb").write_text("{not json")
    twice = tmp_path / "twice" / "bob"
    twice.mkdir(parents=True)
    for name in ("practice.ipynb", "practice (1).ipynb"):
        (twice / name).write_text(json.dumps(submission(course, {})))
    for args, message in [
            (("student", tmp_path / "full", PRACTICE), "is not an empty folder"),
            (("grade", tmp_path, tmp_path, tmp_path / "o"), "is not a course made by"),
            (("grade", course, tmp_path / "none", tmp_path / "o"), "is not a folder"),
            (("grade", course, tmp_path / "full", tmp_path / "o"), "no notebooks"),
            (("grade", course, tmp_path / "twice", tmp_path / "o"), "handed in practice twice"),
            (("student", tmp_path / "o", tmp_path / "full" / "x"), "is not a notebook"),
            (("teacher", tmp_path / "o", tmp_path / "bad.ipynb"), "bad.ipynb is not a readable")]:
        result = command(*args)
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "o").exists() and os.listdir(tmp_path / "full") == ["x"]


def test_lms_downloads_and_symbolic_links_map_to_students(tmp_path):
    """Canvas's flat files and Moodle's folders name their students; a symbolic link is
    reported, not followed; a file that is no notebook says so."""
    from d2l_multi.commands import grading
    nb = json.dumps({"cells": [], "metadata": {"d2l_multi": {"notebook": "practice"}}})
    (tmp_path / "alice_12345_67890_practice.ipynb").write_text(nb)
    (tmp_path / "bob_LATE_222_333_practice-1.ipynb").write_text(nb)
    moodle = tmp_path / "Carol Diaz_4567_assignsubmission_file_"
    moodle.mkdir()
    (moodle / "practice.ipynb").write_text(nb)
    (tmp_path / "outside.ipynb").write_text(nb)
    (tmp_path / "dave").mkdir()
    (tmp_path / "dave" / "practice.ipynb").symlink_to(tmp_path / "outside.ipynb")
    (tmp_path / "erin.ipynb").write_text("{not json")
    found = {(s, n, why.split(":")[0]) for s, _, n, why in grading.submissions(
        tmp_path, {"practice"})}
    assert found == {("alice", "practice", ""), ("bob", "practice", ""),
                     ("Carol_Diaz", "practice", ""), ("outside", "practice", ""),
                     ("dave", None, "a symbolic link"),
                     ("erin", None, "not a readable notebook (JSONDecodeError)")}


@pytest.mark.parametrize("name", ["capstone.rules_2d", "fsdp_and_tensor_parallelism.sp_mlp"])
def test_a_check_that_calls_the_library_is_graded(name, tmp_path, monkeypatch):
    """A test cell's hidden part (the grader's copy of the checks, run where the student's code
    ran) records the reference answer, and the judge (another copy, in the grader's process)
    passes it on the public and the hidden cases: checks that call the library load and run
    both ways."""
    import exercise_answers as answers
    import IPython.display

    from d2l_multi.commands import grading
    module, check_name = name.split(".")
    course = tmp_path / "course"
    course.mkdir()
    grading.install_grader(course)
    published = []
    monkeypatch.setattr(IPython.display, "publish_display_data",
                        lambda data, *args, **kwargs: published.append(data))
    given = answers.REFERENCE[name]
    names = [f"answer{i}" for i in range(len(given))]
    user = dict(zip(names, given))
    exec(grading.payload(course, module, check_name, names, "check", "t0"), user)
    records = [data[grading.MIME] for data in published]
    public, hidden, detail = grading.judge(course, records, (module, check_name, names, 1, 1),
                                           "t0")
    assert public and hidden, detail
    assert detail.startswith(f"PASS {check_name}")
