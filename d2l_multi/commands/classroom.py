"""The chapter as class assignments, with nbgrader (docs/classroom.md).

    python -m d2l_multi classroom student OUT [NOTEBOOK ...]   # the student edition
    python -m d2l_multi classroom teacher COURSE [NOTEBOOK ...]  # an nbgrader course
    python -m d2l_multi classroom grade COURSE SUBMISSIONS OUT   # scores to OUT/grades.csv

NOTEBOOKs are notebooks or folders of them; without any, the notebooks of ``chapters/`` in the
checkout d2l_multi runs from (an installed d2l_multi has none: name them).
The book's notebooks stay the one source. ``assignment`` turns one into nbgrader's format:
the cells before ``## Solutions`` unchanged; for each exercise, an answer cell for the
written part; a cell that calls a check (``check.NAME(answer)``, d2l_multi/exercises/)
becomes an autograded test cell whose hidden part runs the grader's copy of the checks
(commands/grading.py); the code cell that defines the names the check takes becomes the
answer cell whose starter keeps each function's signature and docstring and each value's
name; every other solution cell becomes an empty answer cell. nbgrader then writes the
student edition (``nbgrader generate_assignment``) and grades submissions (``nbgrader
autograde``), each kernel in a bubblewrap sandbox (commands/sandbox.py). The student edition
comes with a wheel of this package, which holds no reference answer and no hidden case.
"""
import argparse
import ast
import json
import pathlib
import re
import shutil
import subprocess
import tempfile

from ._classroom_common import (
    NOTEBOOK_KEY,
    ClassroomError,
    _fresh,
    _nbgrader_command,
)
from .common import path_argument

SOLUTIONS = "## Solutions"
ANSWERS = "## Answers"
CODE_STUB = "...  # YOUR CODE HERE"
TEXT_STUB = "YOUR ANSWER HERE"
BEGIN, END = "### BEGIN SOLUTION", "### END SOLUTION"
LABEL = re.compile(r"^(?:\*\*(\d+)\.\*\*[ \t]*|#{3,4}[ \t]+(?:Exercise[ \t]+)?(\d+)\b.*$)")
CHAPTERS = pathlib.Path(__file__).resolve().parents[2] / "chapters"  # in a checkout





# ----- the book's notebook -> nbgrader's format ---------------------------------------------

def _nbgrader(cell, grade_id, *, solution=False, grade=False, locked=False, points=None):
    meta = {"grade": grade, "grade_id": grade_id, "locked": locked, "schema_version": 3,
            "solution": solution, "task": False}
    if points is not None:
        meta["points"] = points
    cell["metadata"] = {"nbgrader": meta}
    return cell


def _markdown(text):
    return {"cell_type": "markdown", "metadata": {}, "source": text}


def _code(text):
    return {"cell_type": "code", "metadata": {}, "source": text, "outputs": [],
            "execution_count": None}


def _check_calls(source, aliases):
    """The check calls of a cell made only of ``ALIAS.NAME(...)`` calls, ALIAS a module of
    ``d2l_multi.exercises`` as the notebook imports it (``aliases``: {alias: (module, names)}),
    else None."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    calls = []
    for stmt in tree.body:
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        func = getattr(call, "func", None)
        if not (isinstance(call, ast.Call) and isinstance(func, ast.Attribute)
                and isinstance(func.value, ast.Name) and func.value.id in aliases
                and func.attr in aliases[func.value.id][1]):
            return None
        calls.append(call)
    return calls or None


def _argument_names(calls):
    return [a.id for call in calls for a in list(call.args) + [k.value for k in call.keywords]
            if isinstance(a, ast.Name)]


def _defines(source, names):
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return set()
    found = set()
    for stmt in tree.body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(stmt.name)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for t in targets:
                found |= {n.id for n in ast.walk(t) if isinstance(n, ast.Name)}
    return found & set(names)


def _region(lines, indent):
    return [indent + BEGIN, *lines, indent + END]


def mark_answer(source, names, where="a solution cell"):
    """``source`` with nbgrader's solution regions: a function in ``names`` keeps its
    signature and docstring, a value in ``names`` keeps ``name = (...)``, imports stay, and
    everything else is solution (replaced by the starter in the student edition)."""
    tree = ast.parse(source)
    lines = source.split("\n")
    out, removed, pos = [], [], 0

    def flush():
        while removed and not removed[0].strip():  # blank lines stay outside the region
            out.append(removed.pop(0))
        if removed:
            tail = []
            while not removed[-1].strip():
                tail.append(removed.pop())
            out.extend(_region(removed, "") + tail)
            removed.clear()
    for stmt in tree.body:
        first = min([stmt.lineno] + [d.lineno for d in getattr(stmt, "decorator_list", [])]) - 1
        gap, body = lines[pos:first], lines[first:stmt.end_lineno]
        pos = stmt.end_lineno
        if isinstance(stmt, (ast.Import, ast.ImportFrom)):
            flush()
            out += gap + body
        elif isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef)) and stmt.name in names:
            flush()
            inner = stmt.body[1:] if ast.get_docstring(stmt) is not None else stmt.body
            if not inner:
                raise ClassroomError(f"{where}: `{stmt.name}` has no body after its docstring")
            start = min([inner[0].lineno] + [d.lineno for d in
                                             getattr(inner[0], "decorator_list", [])]) - 1
            header_end = stmt.body[0].end_lineno  # the docstring's last line
            if inner is stmt.body:  # no docstring: the signature, however many lines
                header_end = start
                while header_end > first + 1 and lines[header_end - 1].strip()[:1] in ("", "#"):
                    header_end -= 1
            if start < header_end or stmt.body[0].lineno == stmt.lineno:
                raise ClassroomError(f"{where}: write the body of `{stmt.name}` on lines of its "
                                     f"own, below the signature and the docstring")
            indent = re.match(r"\s*", lines[start]).group(0)
            out += gap + lines[first:header_end]
            out += _region(lines[header_end:stmt.end_lineno], indent)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)) and _defines(
                ast.unparse(stmt), names):
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if len(targets) != 1 or not isinstance(targets[0], ast.Name) or stmt.value is None:
                raise ClassroomError(f"{where}: assign each answer alone, `name = value` "
                                     f"({ast.unparse(stmt)[:60]})")
            flush()
            value = ast.get_source_segment(source, stmt.value).split("\n")
            out += gap + [f"{targets[0].id} = ("]
            out += _region(["    " + line for line in value], "    ") + [")"]
        else:
            removed += gap + body
    trailing = lines[pos:]
    if removed:
        removed += trailing
        flush()
    else:
        out += trailing
    return "\n".join(out).rstrip("\n")


def _exercise_chunks(cells):
    """Split the cells under ``## Solutions`` by exercise: {k: (prose, code cells)}."""
    exercises, k = {}, 1
    for cell in cells:
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        if cell["cell_type"] == "markdown":
            for line in source.split("\n"):
                m = LABEL.match(line)
                if m:
                    k = int(m.group(1) or m.group(2))
                    line = line[m.end():] if m.group(1) else ""
                    if not line.strip():
                        exercises.setdefault(k, ([], []))
                        continue
                exercises.setdefault(k, ([], []))[0].append(line)
        elif cell["cell_type"] == "code":
            exercises.setdefault(k, ([], []))[1].append(source)
    return exercises


def _check_aliases(cells, checks):
    """{alias: (module, its check names)} for each ``from d2l_multi.exercises import MODULE
    [as ALIAS]`` in the notebook's code cells (the book imports its notebook's checks as
    ``check``)."""
    aliases = {}
    for cell in cells:
        source = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
        try:
            tree = ast.parse(source) if cell["cell_type"] == "code" else None
        except SyntaxError:
            continue
        for node in ast.walk(tree) if tree else ():
            if isinstance(node, ast.ImportFrom) and node.module == "d2l_multi.exercises":
                for alias in node.names:
                    if alias.name in checks:
                        aliases[alias.asname or alias.name] = (alias.name,
                                                               set(checks[alias.name]))
    return aliases


def assignment(nb, name, checks, course=None):
    """The nbgrader source notebook of the book notebook ``nb`` (a dict), named ``name``;
    ``checks`` maps each exercise module to its check names (``exercises.CHECKS``). Each
    check call becomes a test cell worth 2 points (the public cases, the hidden ones) whose
    hidden part records the student's answers with the grader's copy of the checks in
    ``course/grader`` (commands/grading.py); without ``course``, a temporary one."""
    if course is None:
        with tempfile.TemporaryDirectory() as tmp:
            install_grader(tmp)
            return assignment(nb, name, checks, pathlib.Path(tmp))
    cells = nb["cells"]
    aliases = _check_aliases(cells, checks)

    text = ["".join(c["source"]) if isinstance(c["source"], list) else c["source"]
            for c in cells]
    at = [i for i, (c, t) in enumerate(zip(cells, text))
          if c["cell_type"] == "markdown" and t.strip() == SOLUTIONS]
    out = {**nb, "metadata": {**nb.get("metadata", {}), NOTEBOOK_KEY: {"notebook": name}}}
    if not at:
        out["cells"] = [dict(c) for c in cells]
        return out
    new = [dict(c, source=t) for c, t in zip(cells[:at[0]], text[:at[0]])]
    new.append(_markdown(ANSWERS))
    ids = set()

    def grade_id(base):
        gid, n = base, 1
        while gid in ids:
            n += 1
            gid = f"{base}-{n}"
        ids.add(gid)
        return gid
    for k, (prose, code) in sorted(_exercise_chunks(cells[at[0] + 1:]).items()):
        where = f"{name}, exercise {k}"
        new.append(_markdown(f"### Exercise {k}"))
        new.append(_nbgrader(_markdown("\n".join(prose).strip("\n") or TEXT_STUB),
                             grade_id(f"ex{k}-written"), solution=True, grade=True, points=0))
        calls = {i: _check_calls(src, aliases) for i, src in enumerate(code)}
        wanted = {n for c in calls.values() if c for n in _argument_names(c)}
        found = set()
        other = []

        def flush_other():
            if other:
                new.append(_nbgrader(_code(f"{BEGIN}\n" + "\n\n".join(other) + f"\n{END}"),
                                     grade_id(f"ex{k}-code"), solution=True))
                other.clear()
        for i, src in enumerate(code):
            if calls[i]:
                flush_other()
                missing = [n for n in _argument_names(calls[i]) if n not in found]
                if missing:
                    raise ClassroomError(f"{where}: {ast.unparse(calls[i][0].func)} takes "
                                         f"{missing}, which no code cell of the exercise defines "
                                         f"before it")
                for call in calls[i]:
                    check = call.func.attr
                    alias = call.func.value.id
                    new.append(_nbgrader(_code(test_cell(
                        course, aliases[alias][0], check, _argument_names([call]), alias,
                        ast.unparse(call))),
                        grade_id(f"ex{k}-{check}"), grade=True, locked=True, points=2))
            elif _defines(src, wanted):
                flush_other()
                names = _defines(src, wanted)
                found |= names
                new.append(_nbgrader(_code(mark_answer(src, names, where)),
                                     grade_id(f"ex{k}-answer"), solution=True))
            else:
                other.append(src.strip("\n"))
        flush_other()
    out["cells"] = new
    return out


def _images(nb, folder):
    """The chapter's images (img/...) that the notebook's markdown shows; a link that leaves
    img/ is refused."""
    found = set()
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            src = "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]
            found |= set(re.findall(r"(?:\(|src=[\"'])(img/[^)\"'\s]+)", src))
    root = (folder / "img").resolve()
    for p in sorted(found):
        if not (folder / p).resolve().is_relative_to(root) or (folder / p).is_symlink():
            raise ClassroomError(f"{folder / p}: the image link {p} leaves the notebook's "
                                 f"img/ folder (or is a symbolic link): not copied")
    return sorted(p for p in found if (folder / p).is_file())


# ----- building the course ------------------------------------------------------------------

CONFIG = """\
c = get_config()
c.ClearSolutions.code_stub = {{"python": {code_stub!r}}}
c.ClearSolutions.text_stub = {text_stub!r}
c.Execute.timeout = {timeout}
"""


def _notebooks(paths):
    if not paths:
        if not CHAPTERS.is_dir():
            raise ClassroomError("no notebooks given, and this d2l_multi is installed, not run "
                                 "from a checkout of the chapter: name the notebooks or their "
                                 "folder (the chapters/ folder of a checkout) after the output "
                                 "folder")
        paths = sorted(CHAPTERS.glob("*.ipynb"))
        if not paths:
            raise ClassroomError(f"no notebooks given and none in {CHAPTERS}: name the "
                                 f"notebooks or their folder after the output folder")
    found = []
    for p in map(pathlib.Path, paths):
        if p.is_dir():
            found += sorted(p.glob("*.ipynb"))
        elif p.suffix == ".ipynb" and p.is_file():
            found.append(p)
        else:
            raise ClassroomError(f"{p} is not a notebook (.ipynb) or a folder of notebooks")
    names = [p.stem for p in found]
    if len(set(names)) != len(names):
        raise ClassroomError(f"two notebooks share a name: {sorted(names)}")
    return found








def build_course(course, notebooks, timeout=120):
    """An nbgrader course in ``course``: ``source/NAME/NAME.ipynb`` (solutions and hidden
    tests), ``release/NAME/NAME.ipynb`` (the student edition) and ``gradebook.db``."""
    from .. import exercises
    course = pathlib.Path(course)
    (course / "source").mkdir(parents=True)
    install_grader(course)
    (course / "nbgrader_config.py").write_text(CONFIG.format(
        code_stub=CODE_STUB, text_stub=TEXT_STUB, timeout=int(timeout)))
    for path in notebooks:
        try:
            nb = json.loads(path.read_text())
            if not isinstance(nb.get("cells"), list):
                raise ValueError("it has no list of cells")
        except (OSError, ValueError, AttributeError) as e:
            raise ClassroomError(f"{path} is not a readable notebook: {e}") from None
        folder = course / "source" / path.stem
        folder.mkdir()
        (folder / f"{path.stem}.ipynb").write_text(
            json.dumps(assignment(nb, path.stem, exercises.CHECKS, course), indent=1,
                       ensure_ascii=False) + "\n")
        for image in _images(nb, path.parent):
            (folder / image).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path.parent / image, folder / image)
    result = subprocess.run(_nbgrader_command(
        "generate_assignment", "*", "--force", f"--CourseDirectory.root={course}"),
        capture_output=True, text=True, cwd=course)
    missing = [p.stem for p in notebooks
               if not (course / "release" / p.stem / f"{p.stem}.ipynb").is_file()]
    for p in notebooks:  # a blank code cell: a comment, not `...` (shown as `Ellipsis`)
        release = course / "release" / p.stem / f"{p.stem}.ipynb"
        if release.is_file():
            nb = json.loads(release.read_text())
            for cell in nb["cells"]:
                text = "".join(cell["source"]) if isinstance(cell["source"], list) \
                    else cell["source"]
                if cell["cell_type"] == "code" and text.strip() == CODE_STUB:
                    cell["source"] = "# YOUR CODE HERE"
            release.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
    if result.returncode or missing:
        errors = [line for line in result.stderr.splitlines() if "ERROR" in line or
                  "Error:" in line]
        raise ClassroomError(f"nbgrader could not make the student edition of {missing}: "
                             f"{' / '.join(errors[-3:]) or result.stderr[-500:]}")
    return course


def _build_into(target, what, make):
    """Build in a temporary folder beside ``target``, then rename it: never half-written."""
    target = _fresh(target, what)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=f".{target.name}-", dir=target.parent) as tmp:
        make(pathlib.Path(tmp) / "out")
        if target.exists():
            target.rmdir()
        (pathlib.Path(tmp) / "out").rename(target)
    return target


def student_edition(out, notebooks):
    """The student edition of ``notebooks`` in ``out``: NAME.ipynb and the images."""
    notebooks = _notebooks(notebooks)

    def make(folder):
        with tempfile.TemporaryDirectory() as tmp:
            course = build_course(pathlib.Path(tmp) / "course", notebooks)
            shutil.copytree(course / "release", folder / "release")
        for sub in sorted((folder / "release").iterdir()):
            for item in sub.iterdir():
                dest = folder / item.name
                if item.is_dir():
                    shutil.copytree(item, dest, dirs_exist_ok=True)
                else:
                    shutil.copyfile(item, dest)
        shutil.rmtree(folder / "release")
        student_wheel(folder / "wheel")
    return _build_into(out, "OUT", make)


def student_wheel(folder):
    """A wheel of this package for students, in ``folder``: the library and the public
    checks; reference answers and hidden cases are not in the package (they live in the
    checkout's tests/ and classroom/grader/, and in a course's grader/). Written directly
    (a wheel is a zip with its metadata), with the checkout's pyproject.toml or the installed
    package's metadata for its name, version and dependencies."""
    import base64
    import hashlib
    import tomllib
    import zipfile
    from importlib import metadata
    package = pathlib.Path(__file__).resolve().parents[1]
    project = package.parent / "pyproject.toml"
    if project.is_file():
        info = tomllib.loads(project.read_text())["project"]
        version, requires = info["version"], list(info.get("dependencies", []))
    else:
        version = metadata.version("d2l-multi")
        requires = [r for r in metadata.requires("d2l-multi") or [] if "extra ==" not in r]
    dist = f"d2l_multi-{version}.dist-info"
    files = {}
    for path in sorted(package.rglob("*")):
        rel = path.relative_to(package.parent).as_posix()
        if path.is_file() and "__pycache__" not in rel and not rel.endswith(".pyc"):
            files[rel] = path.read_bytes()
    files[f"{dist}/METADATA"] = "\n".join(
        ["Metadata-Version: 2.1", "Name: d2l-multi", f"Version: {version}",
         *[f"Requires-Dist: {r}" for r in requires], ""]).encode()
    files[f"{dist}/WHEEL"] = (b"Wheel-Version: 1.0\nGenerator: d2l_multi classroom\n"
                              b"Root-Is-Purelib: true\nTag: py3-none-any\n")
    record = []
    for name, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=")
        record.append(f"{name},sha256={digest.decode()},{len(data)}")
    files[f"{dist}/RECORD"] = ("\n".join(record + [f"{dist}/RECORD,,"]) + "\n").encode()
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"d2l_multi-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in files.items():
            z.writestr(name, data)
    return wheel


def teacher_course(course, notebooks):
    return _build_into(course, "COURSE", lambda folder: build_course(folder,
                                                                     _notebooks(notebooks)))


# ----- command line -------------------------------------------------------------------------

HELP = "build the student edition; grade a folder of submitted notebooks"
DESCRIPTION = ("The chapter as class assignments (docs/classroom.md): the student edition, an "
               "nbgrader course with solutions and hidden tests, and offline grading.")


def configure(parser: argparse.ArgumentParser) -> None:
    """The subcommands student, teacher and grade, with their arguments."""
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("student", help="write the student edition: no solutions, starters")
    p.add_argument("out", type=path_argument, help="a new folder")
    p.add_argument("notebooks", nargs="*",
                   help="notebooks or folders of notebooks (default: chapters/ of the "
                        "checkout d2l_multi runs from)")
    p = sub.add_parser("teacher", help="write an nbgrader course: source (solutions, hidden "
                                       "tests), release (the student edition), gradebook.db")
    p.add_argument("course", type=path_argument, help="a new folder")
    p.add_argument("notebooks", nargs="*",
                   help="notebooks or folders of notebooks (default: chapters/ of the "
                        "checkout d2l_multi runs from)")
    p = sub.add_parser("grade", help="grade a folder of submitted notebooks into a CSV")
    p.add_argument("course", type=path_argument, help="the folder `classroom teacher` made")
    p.add_argument("submissions", type=path_argument,
                   help="STUDENT.ipynb files, or STUDENT/ folders of notebooks")
    p.add_argument("out", type=path_argument, help="a new folder: grades.csv, autograded/")
    p.add_argument("--timeout", type=int, default=120,
                   help="seconds a cell may run before it is interrupted (default 120)")
    p.add_argument("--notebook-timeout", type=int, default=1800,
                   help="seconds a whole notebook may run before it is stopped (default 1800)")
    p.add_argument("--jobs", type=int, default=1, help="notebooks graded at once (default 1)")
    p.add_argument("--roster", type=path_argument,
                   help="the class list (one student per line, or a CSV whose first column "
                        "names them): a row for each notebook a student handed nothing in for")
    p.add_argument("--no-sandbox", action="store_true",
                   help="grade where bubblewrap is missing, the submissions' code running "
                        "with your rights (practice only, not for marks)")
    p.add_argument("--full", action="store_true",
                   help="run the notebooks at full size (default: the library's quick mode, "
                        "D2L_MULTI_SMOKE=1, as the checks need no full training)")


def run(args: argparse.Namespace) -> int:
    """Run the classroom subcommand ``args.command``; return the exit status."""
    if args.command == "student":
        out = student_edition(args.out, args.notebooks)
        print(f"student edition: {len(list(out.glob('*.ipynb')))} notebooks in {out}")
    elif args.command == "teacher":
        course = teacher_course(args.course, args.notebooks)
        print(f"nbgrader course in {course}: source/ (solutions, hidden tests), release/ (the "
              f"student edition), gradebook.db")
    else:
        rows = grade(args.course, args.submissions, args.out, args.timeout,
                     args.notebook_timeout, args.jobs, args.full, args.roster,
                     args.no_sandbox)
        graded = len(list((args.out / "autograded").rglob("*.ipynb")))
        print(f"{graded} notebooks graded, {len(rows)} rows: {args.out / 'grades.csv'}; the "
              f"graded notebooks are in {args.out / 'autograded'}")
    return 0


def grade(*args, **kwargs):
    """Grade submissions: ``grading.grade`` (commands/grading.py)."""
    from . import grading
    return grading.grade(*args, **kwargs)


def install_grader(course):
    from . import grading
    return grading.install_grader(course)


def test_cell(*args, **kwargs):
    from . import grading
    return grading.test_cell(*args, **kwargs)
