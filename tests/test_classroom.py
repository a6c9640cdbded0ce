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
import time

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
        "ex1-ring_bytes", "ex2-gpipe_bubble", "ex3-fsdp_spec", "ex4-split_batch"]
    assert source(graded[2]) == (
        "from d2l_multi.exercises import fsdp_and_tensor_parallelism\n"
        "fsdp_and_tensor_parallelism.fsdp_spec(fsdp_spec)\n### BEGIN HIDDEN TESTS\n"
        "fsdp_and_tensor_parallelism.fsdp_spec(fsdp_spec, hidden=True)\n"
        "### END HIDDEN TESTS")
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


MARK = "d2l-classroom-test-4242"
HARM = """\
import os, socket, subprocess
targets = {targets!r}
for path in targets:
    try:
        with open(path, 'a') as f:
            f.write('overwritten')
    except OSError:
        pass
try:
    socket.create_connection(('192.0.2.1', 80), timeout=2)
    print('network reached')
except OSError:
    pass
subprocess.Popen(['sh', '-c', 'exec -a {mark} sleep 600'], start_new_session=True)
"""


def test_grading_three_submissions_gives_the_expected_csv(course, tmp_path):
    """All right, all blank (the student edition as handed out), and half right: one answer
    loops forever (that exercise times out), one raises (that exercise errs), the others
    count; where the sandbox exists, one of its cells also tries to harm the others' scores,
    the teacher's files and the machine."""
    submissions, out = tmp_path / "submitted", tmp_path / "graded"
    submissions.mkdir()
    answers = ("ex1-answer", "ex2-answer", "ex2-code", "ex3-answer", "ex4-answer")
    (submissions / "alice.ipynb").write_text(json.dumps(
        submission(course, {g: solved(course, g) for g in answers})))
    (submissions / "bob").mkdir()
    (submissions / "bob" / "practice (1).ipynb").write_text(json.dumps(submission(course, {})))
    victims = [course / "gradebook.db", course / "source" / "practice" / "practice.ipynb",
               submissions / "alice.ipynb", out / "grades.csv", tmp_path / "outside.txt"]
    sandboxed = classroom.sandbox_prefix() is not None
    (submissions / "carol.ipynb").write_text(json.dumps(submission(course, {
        "ex1-answer": solved(course, "ex1-answer"), "ex3-answer": solved(course, "ex3-answer"),
        "ex2-answer": "def bubble(p, m):\n    while True:\n        pass",
        "ex2-code": HARM.format(targets=[str(v) for v in victims], mark=MARK) if sandboxed
        else "print('no sandbox: no harm tried')",
        "ex4-answer": "raise RuntimeError('not finished')"})))
    before = tree_digest(course), (submissions / "alice.ipynb").read_bytes()
    start = time.perf_counter()
    result = command("grade", course, submissions, out, "--timeout", 60, "--jobs", 2)
    seconds = time.perf_counter() - start
    assert result.returncode == 0, result.stderr
    with open(out / "grades.csv", newline="") as f:
        rows = list(csv.reader(f))
    blank = "returned None: write its body where it says `...`, and return the result"
    assert rows == [
        classroom.COLUMNS,
        ["alice", "practice", "1", "ring_bytes", "1.0", "1.0", "pass", ""],
        ["alice", "practice", "2", "gpipe_bubble", "1.0", "1.0", "pass", ""],
        ["alice", "practice", "3", "fsdp_spec", "1.0", "1.0", "pass", ""],
        ["alice", "practice", "4", "split_batch", "1.0", "1.0", "pass", ""],
        ["bob", "practice", "1", "ring_bytes", "0.0", "1.0", "fail",
         f"FAIL ring_bytes: `bytes_sent` {blank}"],
        ["bob", "practice", "2", "gpipe_bubble", "0.0", "1.0", "fail",
         f"FAIL gpipe_bubble: `bubble` {blank}"],
        ["bob", "practice", "3", "fsdp_spec", "0.0", "1.0", "fail",
         "FAIL fsdp_spec: your PartitionSpec is still `...`: replace it with your answer"],
        ["bob", "practice", "4", "split_batch", "0.0", "1.0", "fail",
         f"FAIL split_batch: `split_batch` {blank}"],
        ["carol", "practice", "1", "ring_bytes", "1.0", "1.0", "pass", ""],
        ["carol", "practice", "2", "gpipe_bubble", "0.0", "1.0", "timeout",
         "no result within 60 s"],
        ["carol", "practice", "3", "fsdp_spec", "1.0", "1.0", "pass", ""],
        ["carol", "practice", "4", "split_batch", "0.0", "1.0", "error",
         "NameError: name 'split_batch' is not defined"],
    ]
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*.ipynb")) == [
        "autograded/alice/practice.ipynb", "autograded/bob/practice.ipynb",
        "autograded/carol/practice.ipynb"]
    print(f"graded 3 submissions in {seconds:.0f} s")
    if not sandboxed:
        pytest.skip("no Linux namespaces here: the sandbox's protections are not tested")
    assert (tree_digest(course), (submissions / "alice.ipynb").read_bytes()) == before
    assert not (tmp_path / "outside.txt").exists()
    outputs = [c.get("outputs") for c in cells(out / "autograded" / "carol" / "practice.ipynb")]
    assert "network reached" not in json.dumps(outputs)
    left = [p for p in pathlib.Path("/proc").glob("[0-9]*/cmdline")
            if MARK.encode() in _read(p)]
    assert not left, "a process the submission started outlived its grading"


def _read(path):
    try:
        return path.read_bytes()
    except OSError:
        return b""


def test_bad_folders_are_refused_with_one_line(course, tmp_path):
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "x").write_text("")
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
            (("student", tmp_path / "o", tmp_path / "full" / "x"), "is not a notebook")]:
        result = command(*args)
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert not (tmp_path / "o").exists() and os.listdir(tmp_path / "full") == ["x"]
