"""Grading submissions against an nbgrader course (``classroom grade``, docs/classroom.md).

Each submitted notebook is autograded by nbgrader in the teacher's process, in a copy of the
course made for it; only its kernel runs the submission's code, in a bubblewrap sandbox
(commands/sandbox.py). The hidden part of each test cell carries the grader's copy of the
checks (``COURSE/grader/checks``) and the hidden cases (``COURSE/grader/MODULE.py``): run
after the student's cells, in a namespace of its own, it only *records* what the student's
code does on the public and the hidden cases; the grader judges those records here, in its
own process, with the same copy of the checks. The visible call of the test cell is silenced,
so nothing the submission does to the checks, or prints, decides a mark. The verdicts go to
the course's gradebook and ``autograded/`` (with the hidden parts removed), so that nbgrader's
``generate_feedback``, formgrader and ``export`` work as usual, and to ``OUT/grades.csv``.
"""
import ast
import base64
import csv
import importlib.util
import inspect
import json
import os
import pathlib
import re
import runpy
import secrets
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

from . import sandbox
from ._classroom_common import (
    BEGIN_HIDDEN,
    END_HIDDEN,
    NOTEBOOK_KEY,
    ClassroomError,
    _fresh,
    _nbgrader_command,
)

KERNEL = "d2l-sandbox"
MIME = "application/vnd.d2l-multi.observations+json"
COLUMNS = ["student", "notebook", "exercise", "check", "public", "hidden", "score",
           "max_score", "outcome", "detail", "seconds"]

def load_check_sources(sources, package="_d2l_grader"):
    """Load check modules from their ``sources`` ({name: source}, ``_common`` first) as
    modules of ``package``, a package of their own, and return {name: module}. The hidden part
    of a test cell runs this very code (RUNNER), so a check that imports a sibling module
    other than ``_common`` or the library relatively fails here as it fails when graded."""
    import sys
    import types
    sys.modules[package] = types.ModuleType(package)
    sys.modules[package].__path__ = []
    loaded = {}
    for name, source in sources.items():
        module = types.ModuleType(f"{package}.{name}")
        module.__package__ = package
        sys.modules[module.__name__] = loaded[name] = module
        exec(compile(source, "<grader>", "exec"), module.__dict__)
    return loaded


def unload_checks(package="_d2l_grader"):
    """Forget the modules ``load_check_sources`` loaded into ``package``."""
    import sys
    for name in [n for n in sys.modules if n.split(".")[0] == package]:
        del sys.modules[name]


# The hidden part of a test cell: load the grader's copy of the checks as modules of their
# own (never through names the student's code could have replaced), record, publish.
RUNNER = inspect.getsource(load_check_sources) + inspect.getsource(unload_checks) + """
try:
    _checks = load_check_sources(SOURCES)
    _checks["_common"]._grade_cell(
        USER, getattr(_checks[MODULE], CHECK), MODULE, ANSWERS, HIDDEN, ALIAS, TOKEN)
finally:
    unload_checks()
"""


# ----- the grader's side of the course --------------------------------------------------------

def grader_source():
    """The grader folder of the checkout (classroom/grader: the hidden cases), or None."""
    folder = pathlib.Path(__file__).resolve().parents[2] / "classroom" / "grader"
    return folder if folder.is_dir() else None


def install_grader(course):
    """``COURSE/grader``: the hidden cases (one module per notebook) and ``checks/``, the
    grader's copy of the checks."""
    from .. import exercises
    grader = pathlib.Path(course) / "grader"
    source = grader_source()
    if source is not None:
        shutil.copytree(source, grader, ignore=shutil.ignore_patterns("__pycache__"))
    else:
        grader.mkdir(parents=True)
    checks = pathlib.Path(exercises.__file__).parent
    shutil.copytree(checks, grader / "checks", ignore=shutil.ignore_patterns("__pycache__"))
    for module in exercises.CHECKS:
        path = grader / f"{module}.py"
        if not path.exists():
            path.write_text(f'"""Hidden cases of the checks of {module}."""\nHIDDEN = {{}}\n')
    return grader


def hidden_cases(course, module):
    """{check: [case, ...]} of ``COURSE/grader/MODULE.py`` (``HIDDEN``, a literal)."""
    path = pathlib.Path(course) / "grader" / f"{module}.py"
    if not path.is_file():
        return {}
    try:  # the teacher's own file, run as Python: cases may be written as expressions
        value = runpy.run_path(str(path)).get("HIDDEN")
    except Exception as e:
        raise ClassroomError(f"{path} does not run: {type(e).__name__}: {e}") from None
    if not isinstance(value, dict) or not all(isinstance(v, list) for v in value.values()):
        raise ClassroomError(f"{path} has no `HIDDEN = {{check: [case, ...]}}`")
    return value


def payload(course, module, check, answers, alias, token="0"):
    """The hidden part of the test cell of ``module.check`` (see RUNNER)."""
    checks = pathlib.Path(course) / "grader" / "checks"
    sources = {name: (checks / f"{name}.py").read_text() for name in ("_common", module)}
    cases = hidden_cases(course, module).get(check, [])
    script = "\n".join([
        f"SOURCES = {sources!r}", f"MODULE = {module!r}", f"CHECK = {check!r}",
        f"ANSWERS = {list(answers)!r}", f"HIDDEN = {repr(list(cases))!r}",
        f"ALIAS = {alias!r}", f"TOKEN = {token!r}", RUNNER])
    blob = base64.b64encode(zlib.compress(script.encode(), 9)).decode()
    lines = [blob[i:i + 76] for i in range(0, len(blob), 76)]
    return "\n".join(["exec(__import__('zlib').decompress(__import__('base64').b64decode(",
                      *[f"    {line!r}" for line in lines],
                      ")).decode(), {'USER': globals()})"])


def test_cell(course, module, check, answers, alias, visible, token="0"):
    """A test cell's source: the import, the hidden part, then the visible call."""
    imported = f"from d2l_multi.exercises import {module}" + (
        f" as {alias}" if alias != module else "")
    return "\n".join([imported, BEGIN_HIDDEN,
                      payload(course, module, check, answers, alias, token), END_HIDDEN,
                      visible])


def _cell_spec(source):
    """(module, check, answers, alias, visible) of a test cell made by ``test_cell``."""
    lines = source.split("\n")
    m = re.match(r"from d2l_multi\.exercises import (\w+)(?: as (\w+))?$", lines[0])
    visible = "\n".join(lines[lines.index(END_HIDDEN) + 1:])
    call = ast.parse(visible).body[0].value
    answers = [a.id for a in call.args if isinstance(a, ast.Name)]
    return m.group(1), call.func.attr, answers, m.group(2) or m.group(1), visible


def refresh_course(course, token):
    """Rewrite the hidden part of every test cell in ``course``'s gradebook, which nbgrader
    grades with, from ``COURSE/grader`` and with this grading's ``token``: cases a teacher
    added count (``source/`` keeps the copy ``classroom teacher`` wrote)."""
    import nbformat
    from nbgrader.api import Gradebook
    from nbgrader.utils import compute_checksum
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        for assignment in gb.assignments:
            for notebook in assignment.notebooks:
                for cell in notebook.source_cells:
                    if cell.cell_type != "code" or BEGIN_HIDDEN not in (cell.source or ""):
                        continue
                    try:
                        spec = _cell_spec(cell.source)
                    except (AttributeError, ValueError, SyntaxError, IndexError):
                        continue  # a test cell of the teacher's own
                    cell.source = test_cell(course, *spec[:4], spec[4], token)
                    nb_cell = nbformat.v4.new_code_cell(cell.source)
                    points = gb.find_graded_cell(cell.name, notebook.name,
                                                 assignment.name).max_score
                    nb_cell.metadata["nbgrader"] = {"grade": True, "solution": False,
                                                    "locked": True, "grade_id": cell.name,
                                                    "points": float(points)}
                    cell.checksum = compute_checksum(nb_cell)
        gb.db.commit()


def load_checks(course):
    """The grader's copy of the checks (``COURSE/grader/checks``), imported in this process
    under a name of its own: the judge."""
    folder = pathlib.Path(course) / "grader" / "checks"
    name = f"_d2l_course_checks_{abs(hash(str(folder)))}"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, folder / "__init__.py",
                                                  submodule_search_locations=[str(folder)])
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def judge(course, output_records, spec, token):
    """(public ok, hidden ok, detail) of a test cell from the records its outputs hold."""
    module, check_name, answers, _, _ = spec
    checks = load_checks(course)
    import importlib
    mod = importlib.import_module(f"{checks.__name__}.{module}")
    common = importlib.import_module(f"{checks.__name__}._common")
    check = getattr(mod, check_name)
    records = [r for r in output_records if isinstance(r, dict) and r.get("token") == token
               and r.get("check") == check_name and r.get("module") == module]
    if len(records) != 1:
        return False, False, "the grader's checks left no record: did the cell run?"
    record = records[0]
    names = [n if isinstance(n, str) else "your function" for n in record.get("names", [])]
    ok, line = common._replay(check, record.get("public"), check.cases, names)
    if not ok:
        return False, False, line
    cases = hidden_cases(course, module).get(check_name, [])
    if not cases:
        return True, True, line
    hidden_ok, hidden_line = common._replay(check, record.get("hidden"), cases, names)
    return True, hidden_ok, (line if hidden_ok else
                             hidden_line.replace(": ", ": on a hidden case: ", 1))


# ----- one submission -------------------------------------------------------------------------

_LOCK = threading.Lock()  # the course's gradebook and folders take one submission at a time
_UIDS = iter(range(1, 10**6))


def _run(command, env, cwd, limit):
    """Run ``command`` in a session of its own: (exit status or None if it ran past
    ``limit`` s and was killed with all it started, CPU seconds of it and its children)."""
    with open(cwd / "log.txt", "wb") as log:
        proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    out = {}

    def reap():
        _, status, usage = os.wait4(proc.pid, 0)
        out["status"], out["cpu"] = os.waitstatus_to_exitcode(status), (
            usage.ru_utime + usage.ru_stime)
        proc.returncode = out["status"]
    waiter = threading.Thread(target=reap)
    waiter.start()
    waiter.join(limit)
    timed_out = waiter.is_alive()
    if timed_out:
        try:
            os.killpg(proc.pid, 9)
        except ProcessLookupError:
            pass
        waiter.join()
    return (None if timed_out else out["status"]), out.get("cpu", 0.0)


def _limit_hit(nb, box, limits):
    """A line naming the sandbox limit the kernel hit, or ''."""
    status, _ = sandbox.kernel_report(box)
    if status == 128 + 24:
        return f"CPU-time limit hit ({limits['cpu']} s): the kernel was stopped"
    names = {o.get("ename") for c in nb.get("cells", []) for o in c.get("outputs", [])
             if o.get("output_type") == "error"}
    text = " ".join(str(o.get("evalue", "")) for c in nb.get("cells", [])
                    for o in c.get("outputs", []) if o.get("output_type") == "error")
    if "MemoryError" in names or "std::bad_alloc" in text:
        return f"memory limit hit ({limits['memory'] / 2**30:g} GiB)"
    if "BlockingIOError" in names or "can't start new thread" in text:
        return f"process limit hit ({limits['processes']} processes)"
    if "File too large" in text or "No space left" in text:
        return f"file-size limit hit ({limits['file_size'] / 2**20:g} MiB)"
    if "DeadKernelError" in names:
        return "the kernel died (a limit of the sandbox, or a crash)"
    return ""


def _verdicts(nb, course, token, timeout):
    """{grade_id: (public, hidden, outcome, detail)} of a graded notebook; its test cells
    lose their hidden part and show the verdict instead of the records."""
    out = {}
    for cell in nb["cells"]:
        meta = cell.get("metadata", {}).get("nbgrader", {})
        if cell["cell_type"] != "code" or not meta.get("grade"):
            continue
        gid = meta.get("grade_id")
        source = cell["source"] if isinstance(cell["source"], str) else "".join(cell["source"])
        try:
            spec = _cell_spec(source)
        except (AttributeError, ValueError, SyntaxError, IndexError):
            continue
        outputs = cell.get("outputs", [])
        records = [o.get("data", {}).get(MIME) for o in outputs
                   if o.get("output_type") in ("display_data", "execute_result")]
        errors = [o for o in outputs if o.get("output_type") == "error"]
        public, hidden, detail = judge(course, records, spec, token)
        if public and hidden:
            outcome = "pass"
        elif errors and not any(records):
            names = {e.get("ename") for e in errors}
            outcome = "timeout" if names & {"CellTimeoutError", "KeyboardInterrupt"} else "error"
            value = (errors[-1].get("evalue") or "").strip().splitlines()
            detail = (f"no result within {timeout} s" if outcome == "timeout" else
                      f"{errors[-1].get('ename')}: {value[0] if value else ''}"[:300])
        else:
            outcome = "fail"
        out[gid] = (public, hidden, outcome, detail)
        cell["source"] = spec[4]
        shown = detail
        cell["outputs"] = [{"output_type": "stream", "name": "stdout",
                            "text": f"{shown}\n"}] if outcome == "pass" else [
            {"output_type": "error", "ename": "CheckFailed", "evalue": shown,
             "traceback": [shown]}]
    return out


def _grade_one(course, student, path, name, root, opts):
    """Grade one submitted notebook in a copy of the course: (rows, seconds)."""
    job = pathlib.Path(tempfile.mkdtemp(prefix="job-", dir=root))
    start = time.monotonic()
    try:
        work, box = job / "course", job / "box"
        for sub in ("course/submitted", "box/work", "box/runtime", "tmp", "home", "spec"):
            (job / sub).mkdir(parents=True)
        for item in ("nbgrader_config.py", "gradebook.db"):
            shutil.copyfile(course / item, work / item)
        target = work / "submitted" / student / name / f"{name}.ipynb"
        target.parent.mkdir(parents=True)
        shutil.copyfile(path, target)
        env = {"PATH": os.pathsep.join([str(pathlib.Path(sys.executable).parent), os.defpath]),
               "HOME": str(job / "home"), "TMPDIR": str(job / "tmp"), "LANG": "C.UTF-8",
               "PYTHONNOUSERSITE": "1", "JUPYTER_CONFIG_DIR": str(job / "home" / ".jupyter"),
               "JUPYTER_DATA_DIR": str(job / "home" / ".local/share/jupyter"),
               "JUPYTER_RUNTIME_DIR": str(box / "runtime"), "JUPYTER_PATH": str(job / "spec"),
               "IPYTHONDIR": str(job / "home" / ".ipython"),
               "PYTHONPATH": str(sandbox.package_folder().parent)}
        kernel_env = {} if opts["full"] else {"D2L_MULTI_SMOKE": "1"}
        args = []
        if opts["sandboxed"]:
            uid = sandbox.UID + next(_UIDS)
            for sub in ("work", "runtime"):
                os.chown(box / sub, uid, uid)
            sandbox.install_kernel(job / "spec", box, uid, KERNEL, opts["limits"],
                                   os.environ.get("D2L_MULTI_DATA"), kernel_env)
            args = [f"--Execute.kernel_name={KERNEL}", "--KernelManager.transport=ipc",
                    f"--KernelManager.ip={box / 'runtime' / 'kernel'}",
                    f"--KernelManager.connection_file={box / 'runtime' / 'kernel.json'}"]
        else:
            env.update(kernel_env)
            if os.environ.get("D2L_MULTI_DATA"):
                env["D2L_MULTI_DATA"] = os.environ["D2L_MULTI_DATA"]
        command = _nbgrader_command("autograde", name, "--student", student, "--force",
                                    f"--CourseDirectory.root={work}",
                                    f"--Execute.timeout={opts['timeout']}", *args)
        status, cpu = _run(command, env, job, opts["notebook_timeout"])
        cpu += sandbox.kernel_report(box)[1]  # the sandboxed kernel is not nbgrader's child
        graded = work / "autograded" / student / name / f"{name}.ipynb"
        cells = _grade_cells(course, name)
        if status != 0 or not graded.is_file():
            log = (job / "log.txt").read_text(errors="replace").strip().splitlines()
            errors = [line for line in log if ("ERROR" in line or "Error" in line)
                      and "see the the above traceback" not in line
                      and "see the above traceback" not in line]
            why = (f"the notebook did not finish within {opts['notebook_timeout']} s"
                   if status is None else
                   f"nbgrader could not grade it: {(errors or log or [status])[-1]}"[:300])
            if status is not None and ("timed out" in "\n".join(log) or any(
                    "CellTimeoutError" in line for line in log)):
                why = (f"a cell ran past --timeout ({opts['timeout']} s) and ignored the "
                       f"interrupt: the kernel was stopped, the notebook not graded")
            if status is not None and "No space left" in "\n".join(log):
                why = "the grader's temporary folder is full (not the student's fault): " \
                      "free space in TMPDIR and grade again"
            return [(student, name, gid, 0, 0, 0.0, float(pts), "not graded", why)
                    for gid, pts in cells] or [
                (student, name, "", 0, 0, 0.0, 0.0, "not graded", why)], cpu
        nb = json.loads(graded.read_text())
        limit = _limit_hit(nb, box, opts["limits"]) if opts["sandboxed"] else ""
        verdicts = _verdicts(nb, course, opts["token"], opts["timeout"])
        graded.write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        rows = []
        for gid, pts in cells:
            public, hidden, outcome, detail = verdicts.get(
                gid, (False, False, "error", "the test cell is missing"))
            if limit and outcome != "pass":
                detail = f"{limit}; {detail}"
            rows.append((student, name, gid, int(public), int(hidden),
                         float(pts) * (public + hidden) / 2, float(pts), outcome, detail))
        with _LOCK:
            _merge(course, work, student, name, rows)
        return rows, cpu
    finally:
        shutil.rmtree(job, ignore_errors=True)
        opts["seconds"][student, name] = time.monotonic() - start


def _merge(course, work, student, name, rows):
    """Put a graded submission into the course: its files in submitted/ and autograded/, its
    grades (the judged scores; written answers left for manual grading) in gradebook.db."""
    from nbgrader.api import Gradebook
    for folder in ("submitted", "autograded"):
        dest = course / folder / student / name
        if dest.exists():
            shutil.rmtree(dest)
        shutil.copytree(work / folder / student / name, dest)
    scores = {r[2]: r[5] for r in rows}
    with Gradebook(f"sqlite:///{work / 'gradebook.db'}") as job_gb:
        done = {g.name: (g.auto_score, g.needs_manual_grade) for g in
                job_gb.find_submission_notebook(name, name, student).grades}
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gb:
        gb.update_or_create_student(student)
        gb.update_or_create_submission(name, student)
        for grade in gb.find_submission_notebook(name, name, student).grades:
            auto, manual = done.get(grade.name, (None, True))
            grade.auto_score = scores.get(grade.name, auto)
            grade.manual_score = None
            grade.needs_manual_grade = bool(manual) and grade.name not in scores
        gb.db.commit()


def _grade_cells(course, name):
    """[(grade_id, points)] of the assignment's autograded cells, in notebook order."""
    nb = json.loads((course / "source" / name / f"{name}.ipynb").read_text())
    return [(c["metadata"]["nbgrader"]["grade_id"], c["metadata"]["nbgrader"]["points"])
            for c in nb["cells"] if c["cell_type"] == "code"
            and c.get("metadata", {}).get("nbgrader", {}).get("grade")]


# ----- the submissions ------------------------------------------------------------------------

CANVAS = re.compile(r"^(?P<student>[A-Za-z0-9-]+?)(?:_LATE)?_\d+_\d+_(?P<file>.+)$")
MOODLE = re.compile(r"^(?P<student>.+?)_\d+_assign(?:submission|feedback)_\w*?_?$")


def _student_name(name):
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name).strip("._") or "unnamed"


def _identify(path, assignments):
    """(the assignment a submitted notebook belongs to or None, why not)."""
    try:
        nb = json.loads(path.read_text())
        name = nb.get("metadata", {}).get(NOTEBOOK_KEY, {}).get("notebook")
        if not isinstance(nb.get("cells"), list):
            return None, "not a notebook: it has no cells"
    except (OSError, ValueError, AttributeError) as e:
        return None, f"not a readable notebook ({type(e).__name__})"
    if name in assignments:
        return name, ""
    stem = CANVAS.match(path.stem).group("file") if CANVAS.match(path.stem) else path.stem
    if stem in assignments:
        return stem, ""
    return None, "not a notebook of this course (no notebook of that name in its metadata)"


def submissions(folder, assignments):
    """[(student, path, assignment or None, why)]: SUBMISSIONS/STUDENT.ipynb,
    SUBMISSIONS/STUDENT/*.ipynb, Canvas's flat ``name_12345_67890_file.ipynb`` and Moodle's
    ``Full Name_12345_assignsubmission_file_/file.ipynb``. Symbolic links are not followed."""
    found = []
    folder = pathlib.Path(folder)
    for path in sorted(folder.rglob("*.ipynb")):
        rel = path.relative_to(folder)
        if any(part.startswith(".") for part in rel.parts):
            continue  # .ipynb_checkpoints and the like
        if len(rel.parts) > 1:
            m = MOODLE.match(rel.parts[0])
            student = m.group("student") if m else rel.parts[0]
        else:
            m = CANVAS.match(path.stem)
            student = m.group("student") if m else path.stem
        student = _student_name(student)
        if any((folder / pathlib.Path(*rel.parts[:i + 1])).is_symlink()
               for i in range(len(rel.parts))):
            found.append((student, path, None, "a symbolic link: not followed, not graded"))
            continue
        name, why = _identify(path, assignments)
        found.append((student, path, name, why))
    return found


def _roster(path):
    """The student names of a roster: one per line, or the first column of a CSV."""
    try:
        text = pathlib.Path(path).read_text()
    except OSError as e:
        raise ClassroomError(f"--roster {path}: {e.strerror}") from None
    names = []
    for row in csv.reader(text.splitlines()):
        if row and row[0].strip() and not row[0].startswith("#"):
            names.append(_student_name(row[0].strip()))
    if names and names[0].lower() in ("student", "name", "id", "student_id"):
        names = names[1:]
    return names


# ----- grading a class ------------------------------------------------------------------------

def grade(course, submissions_folder, out, timeout=120, notebook_timeout=1800, jobs=1,
          full=False, roster=None, no_sandbox=False, limits=None):
    """Grade every submitted notebook under ``submissions_folder`` against the course; write
    ``out/grades.csv`` and ``out/autograded/STUDENT/NOTEBOOK.ipynb``, and fill the course's
    gradebook and autograded/ (for nbgrader's feedback, formgrader and export). Returns the
    rows of the CSV."""
    _nbgrader_command()
    course = pathlib.Path(course).resolve()
    if not (course / "gradebook.db").is_file() or not (course / "source").is_dir() or not (
            course / "grader" / "checks").is_dir():
        raise ClassroomError(f"{course} is not a course made by `python -m d2l_multi classroom "
                             f"teacher COURSE`: it has no gradebook.db, source/ and grader/")
    if not pathlib.Path(submissions_folder).is_dir():
        raise ClassroomError(f"SUBMISSIONS {submissions_folder} is not a folder of notebooks")
    for flag, value in (("--timeout", timeout), ("--notebook-timeout", notebook_timeout),
                        ("--jobs", jobs)):
        if not (isinstance(value, int) and value > 0):
            raise ClassroomError(f"{flag} must be a positive integer, got {value!r}")
    why = sandbox.available() or (None if os.geteuid() == 0 else
                                  "the sandbox's user switch needs root: grade as root")
    if why and not no_sandbox:
        raise ClassroomError(f"no sandbox for the submissions' code: {why}; or pass "
                             f"--no-sandbox to run them with your rights (not for marks)")
    names = _roster(roster) if roster else []
    assignments = sorted(p.name for p in (course / "source").iterdir() if p.is_dir())
    found = submissions(submissions_folder, set(assignments))
    if not found and not names:
        raise ClassroomError(f"no notebooks (.ipynb) under {submissions_folder}")
    seen = {}
    for student, path, name, _ in found:
        if name is not None and seen.setdefault((student, name), path) != path:
            raise ClassroomError(f"{student} handed in {name} twice ({seen[student, name]} "
                                 f"and {path}): keep one")
    out = _fresh(out, "OUT")
    out.mkdir(parents=True, exist_ok=True)
    token = secrets.token_hex(16)
    refresh_course(course, token)
    root = pathlib.Path(tempfile.mkdtemp(prefix="d2l-grade-"))
    os.chmod(root, 0o755)
    opts = {"timeout": int(timeout), "notebook_timeout": notebook_timeout, "full": full,
            "sandboxed": not why, "limits": {**sandbox.LIMITS, **(limits or {})},
            "token": token, "seconds": {}}
    if why:
        print(f"classroom grade: --no-sandbox: submissions run with your rights ({why})",
              file=sys.stderr)
    lock, done = threading.Lock(), [0]

    def one(item):
        student, path, name, why_not = item
        cpu = 0.0
        if name is None:
            rows = [(student, path.name, "", 0, 0, 0.0, 0.0, "not graded", why_not)]
        else:
            try:
                rows, cpu = _grade_one(course, student, path, name, root, opts)
            except Exception as e:  # the kit's own failure: this submission only
                rows = [(student, name, "", 0, 0, 0.0, 0.0, "not graded",
                         f"the grader failed: {type(e).__name__}: {e}"[:300])]
        with lock:
            done[0] += 1
            print(f"[{done[0]}/{len(found)}] {student} {path.name}: "
                  f"{sum(r[5] for r in rows):g}/{sum(r[6] for r in rows):g}", file=sys.stderr)
        return rows, cpu, student, name
    try:
        with ThreadPoolExecutor(jobs) as pool:
            results = list(pool.map(one, found))
        rows, handed = [], set()
        for part, cpu, student, name in results:
            seconds = round(cpu, 1)
            rows += [(s, n, _exercise_of(g), _check_of(g), pu, hi, sc, mx, o, d, seconds)
                     for s, n, g, pu, hi, sc, mx, o, d in part]
            if name is not None:
                handed.add((student, name))
                src = course / "autograded" / student / name / f"{name}.ipynb"
                if src.is_file():
                    dest = out / "autograded" / student / f"{name}.ipynb"
                    dest.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(src, dest)
        for student in names:
            for name in assignments:
                if (student, name) not in handed:
                    rows.append((student, name, "", "", 0, 0, 0.0, 0.0, "missing",
                                 "handed nothing in", ""))
        totals = {}
        for r in rows:
            if r[8] != "missing":
                t = totals.setdefault((r[0], r[1]), [0.0, 0.0, r[10]])
                t[0] += r[6]
                t[1] += r[7]
        rows += [(s, n, "", "total", "", "", sc, mx, "", "", sec)
                 for (s, n), (sc, mx, sec) in sorted(totals.items())]
        tmp = out / ".grades.csv.tmp"
        with open(tmp, "w", newline="") as f:
            writer = csv.writer(f)
            writer.writerow(COLUMNS)
            writer.writerows(rows)
        tmp.replace(out / "grades.csv")
        return rows
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _exercise_of(grade_id):
    m = re.match(r"ex(\d+)-", grade_id or "")
    return int(m.group(1)) if m else ""


def _check_of(grade_id):
    m = re.match(r"ex\d+-(\w+?)(?:-\d+)?$", grade_id or "")
    return m.group(1) if m else grade_id
