"""Build the chapter as a book (Sphinx + MyST-NB), and refresh the notebooks' stored outputs.

``python -m d2l_multi book`` renders the notebooks' stored outputs without executing anything:
every notebook in ``chapters/`` is committed with the outputs of a full run. ``--rerun``
first executes every notebook (or only the NOTEBOOKs named) at full size with nbclient, in its
folder, and writes its outputs back with a record of the run (``metadata["d2l_multi"]["run"]``:
the hash of its code cells and of its outputs, the machine, the versions, the seconds, the
date); then it renders the book. A notebook that fails keeps its old file, and the command names
it and exits 1 without building the book. ``stale(nb)`` says why a notebook's outputs are not
those of a full run of its current code (tests/test_notebooks.py).

``--smoke`` executes copies of the notebooks with ``D2L_MULTI_SMOKE=1`` (cached by
jupyter-cache in ``_build/jupyter_cache_smoke``; with ``--rerun``, afresh) into its own folder,
``_build/html-smoke``; it never writes into ``chapters/``. Kernels share JAX's persistent
compilation cache (``_build/jax_cache``, emptied by ``--rerun``). The notebooks are pages in
file-name order: those of the checkout the package runs from, or of the folder ``--chapters``
names (with ``book/`` beside it). Warnings fail the build, and the book at ``--out`` is
replaced only by a build that succeeded, and only if it holds nothing but the files an earlier
build wrote (each build lists them in ``.d2l-book-files``).
"""
import argparse
import datetime
import hashlib
import importlib.util
import json
import os
import pathlib
import re
import shutil
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Iterable

from ..errors import AlreadyExistsError, InputError, NotFoundError, PathError
from ..hardware import versions
from .common import describe_machine, path_argument

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the checkout, when run from one
MODES = ("stored", "smoke")  # render the stored outputs; execute copies with the smoke switch
KERNEL_TIMEOUT = 1800  # seconds a cell may run (a notebook's full run takes at most 10 minutes)
RUN_KEY = "d2l_multi"  # notebook metadata: {"run": the record of the run behind its outputs}
REFRESH = "python -m d2l_multi book --rerun"
NEEDS = ("sphinx", "myst_nb", "jupyter_cache", "sphinx_book_theme",
         "sphinxcontrib.bibtex")  # modules of the book extra
LISTING = ".d2l-book-files"  # the files a build wrote into a folder, one path a line


def _files(folder):
    return {p.relative_to(folder).as_posix() for p in folder.rglob("*") if not p.is_dir()}


def list_files(folder):
    """Record the files in ``folder`` as written by a build (``check_replaceable``)."""
    (folder / LISTING).write_text("".join(f"{name}\n" for name in sorted(_files(folder))))


def check_replaceable(folder):
    """Raise FileExistsError unless ``folder`` is absent, empty, or holds nothing but the
    files a build wrote into it: a build never deletes what it did not write."""
    if not folder.exists():
        return
    if not folder.is_dir():
        raise AlreadyExistsError(f"{folder} is a file; pass --out a new or empty folder")
    if os.path.ismount(folder):
        raise AlreadyExistsError(f"{folder} is a mount point, which the build cannot replace; "
                              f"pass --out a folder inside it")
    listing = folder / LISTING
    written = set(listing.read_text().splitlines()) if listing.is_file() else set()
    others = sorted(_files(folder) - written - {LISTING})
    if others:
        more = f" and {len(others) - 3} more" if len(others) > 3 else ""
        raise AlreadyExistsError(f"{folder} holds files that no build of the book wrote "
                              f"({', '.join(others[:3])}{more}); the build replaces the "
                              f"folder, so pass --out a new or empty folder, or move them")


def keep_widget_output_in_cells():
    """Make nbclient leave ipywidgets' Output widgets to the kernel: what one captures (an
    ``interact`` function's printout) stays an ordinary output of its cell.

    nbclient mimics a browser's Output widget by sending the kernel a comm message on the
    shell channel while it awaits the cell's ``execute_reply`` on that channel. pyzmq's
    asyncio socket can then miss the reply's arrival (its notification is edge-triggered):
    the reply stays unread and the cell waits out its timeout (nbclient 0.11, pyzmq 27; see
    https://github.com/jupyter/nbclient/issues/312). Without the mimic the client sends
    nothing while it waits. Applies to every NotebookClient of this process.
    """
    from nbclient import NotebookClient
    NotebookClient.on_comm_open_jupyter_widget = lambda self, msg: None


def checkout_chapters():
    """The ``chapters/`` folder of the checkout this package runs from, or None when it runs
    from an installation (a wheel), which has no notebooks."""
    chapters = ROOT / "chapters"
    return chapters if chapters.is_dir() and (ROOT / "book" / "conf.py").is_file() else None


def chapters_folder(chapters=None):
    """``chapters`` (a folder of notebooks), else the checkout's ``chapters/``; raise
    InputError when neither is there."""
    if chapters is not None:
        folder = pathlib.Path(chapters).resolve()
        if not folder.is_dir():
            what = "is a file" if folder.exists() else "does not exist"
            raise InputError(f"--chapters {chapters} {what}; pass the folder of the notebooks")
        return folder
    found = checkout_chapters()
    if found is None:
        raise InputError("no chapters folder: this d2l_multi is installed, not run from a "
                         "checkout of the chapter; pass --chapters DIR, the chapters/ folder "
                         "of a checkout (book/ beside it)")
    return found


def book_paths(chapters):
    """Return the book's sources, default output folders and caches for the notebooks in
    ``chapters``: ``book/`` and ``_build/`` are beside it."""
    chapters = pathlib.Path(chapters)
    root = chapters.parent
    build = root / "_build"
    return {"conf": root / "book", "chapters": chapters, "out": build / "html",
            "out_smoke": build / "html-smoke", "cache_smoke": build / "jupyter_cache_smoke",
            "jax_cache": build / "jax_cache"}


def _text(source):
    return "".join(source) if isinstance(source, list) else source


def code_hash(nb):
    """'sha256:...' of the code cells' sources of ``nb`` (a notebook as a dict), in order; line
    ends and trailing white space do not count."""
    texts = [_text(c["source"]).replace("\r\n", "\n").rstrip()
             for c in nb["cells"] if c["cell_type"] == "code"]
    return "sha256:" + hashlib.sha256(json.dumps(texts).encode()).hexdigest()


def outputs_hash(nb):
    """'sha256:...' of the code cells' outputs of ``nb``, however a tool splits their text
    into lines: a later execution (by hand, in smoke mode) changes it."""
    def joined(value):
        if isinstance(value, dict):
            return {key: joined(v) for key, v in value.items()}
        if isinstance(value, list):
            return ("".join(value) if all(isinstance(v, str) for v in value) else
                    [joined(v) for v in value])
        return value
    outputs = [joined(c.get("outputs", [])) for c in nb["cells"] if c["cell_type"] == "code"]
    text = json.dumps(outputs, sort_keys=True, ensure_ascii=False)
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()


def stale(nb):
    """Why the stored outputs of ``nb`` (a notebook as a dict) are not those of a full run of
    its current code by ``python -m d2l_multi book --rerun``; None when they are."""
    code = [c for c in nb["cells"] if c["cell_type"] == "code"]
    for i, cell in enumerate(code):
        for output in cell.get("outputs", []):
            if output.get("output_type") == "error":
                return f"code cell {i} holds an error output ({output.get('ename')})"
    if not any(cell.get("outputs") for cell in code):
        return "no stored outputs"
    run = nb.get("metadata", {}).get(RUN_KEY, {}).get("run")
    if not isinstance(run, dict):
        return "no record of the run its outputs come from"
    if run.get("smoke") is not False:
        return "its outputs come from a smoke run (D2L_MULTI_SMOKE=1), not a full one"
    if run.get("code_hash") != code_hash(nb):
        return "its code cells changed after its outputs were computed"
    if run.get("outputs_hash") != outputs_hash(nb):
        return "its outputs changed after the full run that recorded them"
    return None


def stale_notebooks(chapters):
    """``{name: reason}`` for each notebook in ``chapters`` whose outputs are ``stale``."""
    found = {}
    for path in sorted(pathlib.Path(chapters).glob("*.ipynb")):
        reason = stale(json.loads(path.read_text()))
        if reason:
            found[path.stem] = reason
    return found


class NotebookFailed(RuntimeError):
    """A notebook that could not be refreshed; its file is unchanged."""


def refresh_notebook(path, jax_cache=None, smoke=False, timeout=KERNEL_TIMEOUT):
    """Execute the notebook at ``path`` in its folder, full size (``smoke``: with
    ``D2L_MULTI_SMOKE=1``), and write its outputs and run record back in its place; return the
    seconds it ran. The kernel shares JAX's compilation cache in ``jax_cache`` (when given).
    Raises NotebookFailed, leaving the file as it was, when a cell fails or times out, the
    kernel dies, or the file changed while it ran."""
    import nbformat
    from nbclient import NotebookClient
    path = pathlib.Path(path).resolve()
    before = path.read_bytes()
    nb = nbformat.reads(before.decode(), as_version=4)
    # a reader's figures are stored inline: the kernel picks Jupyter's inline backend itself,
    # unless a backend in the environment (MPLBACKEND=Agg, as in tests) draws into nothing
    env = {name: value for name, value in os.environ.items()
           if name not in ("D2L_MULTI_SMOKE", "MPLBACKEND")}
    if smoke:
        env["D2L_MULTI_SMOKE"] = "1"
    if jax_cache is not None:
        env.update(compilation_cache_env(jax_cache, env))
    keep_widget_output_in_cells()
    client = NotebookClient(nb, timeout=timeout, record_timing=False,
                            resources={"metadata": {"path": str(path.parent)}})
    machine = describe_machine()
    date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    start = time.perf_counter()
    try:
        client.execute(env=env)
    except Exception as err:  # a failed cell, a timeout, a dead kernel: the file stays
        raise NotebookFailed(f"{path.name}: {type(err).__name__}: {err}") from err
    seconds = time.perf_counter() - start
    nb.metadata.setdefault(RUN_KEY, {})["run"] = {
        "code_hash": code_hash(nb), "outputs_hash": outputs_hash(nb), "smoke": smoke,
        "machine": machine, "versions": versions(), "seconds": round(seconds, 1),
        "date": date}
    text = nbformat.writes(nb).rstrip("\n") + "\n"
    if path.read_bytes() != before:
        raise NotebookFailed(f"{path.name} changed while it ran; its outputs were not "
                             f"written: run it again")
    tmp = path.with_name(f".{path.name}.refreshing")
    try:
        tmp.write_text(text)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return seconds


def refresh_notebooks(notebooks, jax_cache=None, say=print):
    """Refresh each of ``notebooks`` (``refresh_notebook``), saying each one's time as it
    ends; return the rows (name, 'refreshed' or 'failed', seconds) and the failures'
    messages. A failure does not stop the others."""
    rows, failures = [], []
    for path in notebooks:
        start = time.perf_counter()
        try:
            seconds = refresh_notebook(path, jax_cache)
        except NotebookFailed as err:
            seconds = time.perf_counter() - start
            rows.append((pathlib.Path(path).stem, "failed", seconds))
            failures.append(str(err))
        else:
            rows.append((pathlib.Path(path).stem, "refreshed", seconds))
        say(f"{rows[-1][0]}: {rows[-1][1]} in {seconds:.0f} s")
    return rows, failures


def compilation_cache_env(folder, environ=None):
    """The environment variables that make every notebook kernel share JAX's persistent
    compilation cache in ``folder`` (every program, however fast it compiles); a variable
    already set in ``environ`` (default ``os.environ``) is left as it is."""
    environ = os.environ if environ is None else environ
    wanted = {"JAX_COMPILATION_CACHE_DIR": str(folder),
              "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0",
              "JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES": "-1"}
    return {name: value for name, value in wanted.items() if name not in environ}


LINK = re.compile(r"\]\(\s*<?([^)\s>]+)|<img[^>]*?\ssrc=[\"']([^\"']+)")  # markdown, HTML
SCHEME = re.compile(r"[a-z][a-z0-9+.-]*:", re.I)  # https:, mailto:, ... (not a file)


def check_links(chapters: pathlib.Path, notebooks: Iterable[pathlib.Path]) -> None:
    """Raise a PathError naming the first link or image in the notebooks' markdown whose path
    leaves ``chapters`` once resolved (``img/../../x``, an absolute path): Sphinx would copy
    that file into the book."""
    root = pathlib.Path(chapters).resolve()
    for nb in notebooks:
        try:
            cells = json.loads(pathlib.Path(nb).read_text(encoding="utf-8"))["cells"]
        except (ValueError, KeyError, TypeError) as err:
            raise InputError(f"{nb} is not a notebook ({type(err).__name__}: {err}); the "
                             f"book takes Jupyter notebooks (.ipynb)") from None
        for cell in cells:
            if cell["cell_type"] != "markdown":
                continue
            for match in LINK.finditer("".join(cell["source"])):
                target = urllib.parse.unquote((match[1] or match[2]).split("#")[0])
                if target and not SCHEME.match(target) and \
                        not (root / target).resolve().is_relative_to(root):
                    raise PathError(f"{pathlib.Path(nb).name} links to {target}, which leaves "
                                    f"{chapters}; the book takes only the files under it: "
                                    f"link to a copy there, or to a URL")


def stage_sources(chapters, dest):
    """Copy ``book/``, ``chapters/*.ipynb`` and ``chapters/img/`` into ``dest``, the Sphinx
    source folder."""
    paths = book_paths(chapters)
    if not (paths["conf"] / "conf.py").is_file():
        raise NotFoundError(f"{paths['conf'] / 'conf.py'} is missing: the book needs the "
                            f"book/ folder of a checkout of the chapter beside "
                            f"{paths['chapters']}")
    notebooks = sorted(paths["chapters"].glob("*.ipynb"))
    if not notebooks:
        raise NotFoundError(f"no notebooks in {paths['chapters']}: the book needs "
                            f"chapters/*.ipynb")
    check_links(paths["chapters"], notebooks)
    shutil.copytree(paths["conf"], dest, ignore=shutil.ignore_patterns("__pycache__"))
    (dest / "chapters").mkdir()
    for nb in notebooks:
        shutil.copy2(nb, dest / "chapters" / nb.name)
    if (paths["chapters"] / "img").is_dir():  # the notebooks' figures
        shutil.copytree(paths["chapters"] / "img", dest / "chapters" / "img")
    return [nb.stem for nb in notebooks]


class ShownPaths:
    """A text stream that shows the staged sources' paths as the repository's own."""

    def __init__(self, stream, replacements):
        self.stream, self.replacements = stream, replacements

    def write(self, text):
        for staged, real in self.replacements:
            text = text.replace(staged, real)
        return self.stream.write(text)

    def flush(self):
        self.stream.flush()

    def isatty(self):
        return self.stream.isatty()


def execution_table(app, started):
    """Rows (page, how, seconds) from MyST-NB's record of each notebook's execution."""
    rows = []
    for docname, data in sorted(getattr(app.env, "nb_metadata", {}).items()):
        run = data.get("exec_data")
        if not run:
            continue
        how = ("failed" if not run["succeeded"] else
               "executed" if run["mtime"] >= started else "cached")
        rows.append((docname.rsplit("/", 1)[-1], how, run["runtime"]))
    return rows


def format_table(rows):
    width = max(len(name) for name, _, _ in rows)
    lines = [f"{'notebook':<{width}}  {'run':<8}  seconds"]
    for name, how, seconds in rows:
        shown = "-" if seconds is None else f"{seconds:.1f}"
        lines.append(f"{name:<{width}}  {how:<8}  {shown:>7}")
    return "\n".join(lines)


def build_book(out=None, mode="stored", chapters=None, rerun=False, quiet=False):
    """Build the book of the notebooks in ``chapters`` (default: the checkout's) into ``out``
    and return ``(index, rows)``.

    ``mode`` 'stored' renders the outputs stored in the notebooks (nothing is executed; a
    banner names the notebooks whose outputs are ``stale``) into ``_build/html`` by default;
    'smoke' executes copies with ``D2L_MULTI_SMOKE=1``, through its own cache (emptied first
    when ``rerun``), into ``_build/html-smoke``. ``rows`` lists each executed notebook's run
    time. Raises RuntimeError when Sphinx reports a warning or an error; ``out`` is then left
    as it was. An existing ``out`` is replaced only if it is empty or an earlier build of the
    book.
    """
    if mode not in MODES:
        raise InputError(f"mode is {mode!r}; use one of {', '.join(MODES)}")
    chapters = chapters_folder(chapters)
    missing = [name for name in NEEDS if importlib.util.find_spec(name) is None]
    if missing:
        raise RuntimeError(f"the book needs {', '.join(missing)}, which are not installed: "
                           f"pip install -e \".[book]\"")
    from sphinx.application import Sphinx
    from sphinx.errors import SphinxError
    from sphinx.util.docutils import docutils_namespace, patch_docutils

    paths = book_paths(chapters)
    smoke = mode == "smoke"
    out = pathlib.Path(out or paths["out_smoke" if smoke else "out"]).resolve()
    reports = out.parent / f"{out.name}-reports"
    check_replaceable(out)
    check_replaceable(reports)
    out.parent.mkdir(parents=True, exist_ok=True)
    cache = paths["cache_smoke"]
    if smoke and rerun:  # every notebook and program executed and compiled afresh
        shutil.rmtree(cache, ignore_errors=True)
        shutil.rmtree(paths["jax_cache"], ignore_errors=True)
    kernel_env = compilation_cache_env(paths["jax_cache"]) if smoke else {}
    overrides = {"nb_execution_mode": "cache" if smoke else "off",
                 "nb_execution_cache_path": str(cache), "nb_execution_timeout": KERNEL_TIMEOUT,
                 "d2l_book_mode": mode,
                 "d2l_book_stale": [] if smoke else sorted(stale_notebooks(chapters))}
    shutil.rmtree(reports, ignore_errors=True)  # an earlier build's (check_replaceable)
    saved_env = os.environ.get("D2L_MULTI_SMOKE")
    work = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}-building-", dir=out.parent))
    try:
        src, html = work / "src", work / "html"
        stage_sources(chapters, src)
        if smoke:
            os.environ["D2L_MULTI_SMOKE"] = "1"
        os.environ.update(kernel_env)  # the kernels inherit it: one compilation cache for all
        started = time.time()
        shown = [(str(src / "chapters"), str(paths["chapters"])), (str(src), str(paths["conf"])),
                 (str(html / "reports"), str(reports)), (str(html), str(out))]
        shown += [(os.path.relpath(a), os.path.relpath(b)) for a, b in shown]
        status = None if quiet else ShownPaths(sys.stdout, shown)
        keep_widget_output_in_cells()  # MyST-NB runs the notebooks with nbclient, here
        try:
            with patch_docutils(src), docutils_namespace():
                app = Sphinx(src, src, html, work / "doctrees", "html",
                             confoverrides=overrides, status=status,
                             warning=ShownPaths(sys.stderr, shown),
                             freshenv=True, warningiserror=True)
                app.build()
        except SphinxError as err:
            raise RuntimeError(f"the book did not build: {err}; {out} is unchanged") from err
        if app.statuscode:
            if (html / "reports").is_dir():  # tracebacks of failed notebooks
                list_files(html / "reports")
                (html / "reports").rename(reports)
            raise RuntimeError(f"the book did not build: fix the warnings or errors listed "
                               f"above (warnings count as errors); {out} is unchanged")
        rows = execution_table(app, started) if smoke else []
        list_files(html)
        old = work / "previous"
        if out.exists():
            out.rename(old)
        html.rename(out)
    finally:
        if saved_env is None:
            os.environ.pop("D2L_MULTI_SMOKE", None)
        else:
            os.environ["D2L_MULTI_SMOKE"] = saved_env
        for name in kernel_env:
            os.environ.pop(name, None)
        shutil.rmtree(work, ignore_errors=True)
        if smoke and cache.exists():
            forget_staged_notebooks(cache)
    return out / "index.html", rows


def forget_staged_notebooks(cache):
    """Drop the cache's records of staged notebooks that are gone (executed ones stay cached)."""
    from jupyter_cache import get_cache
    cache = get_cache(str(cache))
    for record in cache.list_project_records():
        if not pathlib.Path(record.uri).exists():
            cache.remove_nb_from_project(record.pk)


HELP = "build the chapter as an HTML book; refresh the notebooks' outputs"
DESCRIPTION = ("Build the chapter as a book (HTML) from book/ and chapters/*.ipynb, showing the "
               "outputs stored in the notebooks (nothing is executed). --rerun first executes "
               "every notebook, or the NOTEBOOKs named, at full size and writes its outputs "
               "back. An installed d2l_multi has no notebooks: pass --chapters, the chapters/ "
               "folder of a checkout.")


def configure(parser: argparse.ArgumentParser) -> None:
    """The options of ``python -m d2l_multi book``."""
    parser.add_argument("notebooks", nargs="*", type=path_argument, metavar="NOTEBOOK",
                        help="with --rerun: refresh only these notebooks (default: all)")
    parser.add_argument("--rerun", action="store_true",
                        help="execute the notebooks at full size and write their outputs "
                             "back into them, then build the book (with --smoke: execute "
                             "every copy afresh)")
    parser.add_argument("--smoke", action="store_true",
                        help="execute copies with D2L_MULTI_SMOKE=1 into _build/html-smoke "
                             "(quick; numbers are not results; chapters/ is not written)")
    parser.add_argument("--chapters", type=path_argument, default=None, metavar="DIR",
                        help="the notebooks, with the book's book/ folder beside DIR (default: "
                             "chapters/ of the checkout d2l_multi runs from)")
    parser.add_argument("--out", type=path_argument, default=None,
                        help="output folder (default: _build/html, or _build/html-smoke, "
                             "beside the chapters folder)")
    parser.add_argument("--quiet", "-q", action="store_true", help="print only warnings")


def notebooks_to_refresh(names, chapters):
    """The notebooks ``names`` (paths), or every notebook in ``chapters``; InputError for a
    name that is not a notebook file."""
    if not names:
        found = sorted(pathlib.Path(chapters).glob("*.ipynb"))
        if not found:
            raise InputError(f"no notebooks in {chapters}")
        return found
    for name in names:
        if name.suffix != ".ipynb" or not name.is_file():
            raise InputError(f"NOTEBOOK {name} is not a notebook file (.ipynb)")
    return [name.resolve() for name in dict.fromkeys(names)]


def run(args: argparse.Namespace) -> int:
    """Build the book as ``args`` say; return the exit status."""
    if args.notebooks and (args.smoke or not args.rerun):
        raise InputError("NOTEBOOKs are refreshed by --rerun alone: python -m d2l_multi book "
                         "--rerun chapters/NAME.ipynb")
    mode = "smoke" if args.smoke else "stored"
    chapters = chapters_folder(args.chapters)
    start = time.perf_counter()
    rows = []
    if args.rerun or args.smoke:  # execution times mean something only next to the machine
        print(f"machine before the run: {describe_machine()}\n{versions()}")
    if args.rerun and not args.smoke:
        notebooks = notebooks_to_refresh(args.notebooks, chapters)
        jax_cache = book_paths(chapters)["jax_cache"]
        shutil.rmtree(jax_cache, ignore_errors=True)  # every program compiled afresh
        say = (lambda line: None) if args.quiet else (lambda line: print(line, flush=True))
        rows, failures = refresh_notebooks(notebooks, jax_cache, say)
        if failures:
            print("\n\n".join(failures), file=sys.stderr)
            names = [name for name, how, _ in rows if how == "failed"]
            print(f"book: {len(names)} notebook(s) failed and keep their old outputs: "
                  f"{', '.join(names)}; the book was not built", file=sys.stderr)
            return 1
    try:
        index, executed = build_book(args.out, mode, chapters, rerun=args.rerun,
                                     quiet=args.quiet)
    except (RuntimeError, FileNotFoundError, FileExistsError) as err:
        print(f"book: {err}", file=sys.stderr)
        return 1
    rows += executed
    seconds = time.perf_counter() - start
    if rows:
        print(format_table(rows))
    what = {"stored": "stored outputs", "smoke": "smoke run"}[mode]
    print(f"book ({what}) written to {index.parent} in {seconds:.0f} s; open {index}")
    return 0
