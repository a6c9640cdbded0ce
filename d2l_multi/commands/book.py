"""Build the chapter as a book (Sphinx + MyST-NB): ``python -m d2l_multi book``.

The landing page and configuration live in ``book/``, the pages are ``chapters/*.ipynb`` in
file-name order: those of the checkout the package runs from, or of the folder ``--chapters``
names (with ``book/`` beside it). By default every notebook is executed through jupyter-cache,
so a rebuild
re-runs only notebooks whose code changed (changes to ``d2l_multi`` itself are not noticed:
pass ``--rerun`` after them). The notebooks' kernels share JAX's persistent compilation cache
(``_build/jax_cache``; ``--rerun`` empties it too), so a program several notebooks compile alike
is compiled once. ``--smoke`` executes with ``D2L_MULTI_SMOKE=1`` and its own
cache; ``--no-execute`` shows the code without outputs. Warnings fail the build, and the book
at ``--out`` is replaced only by a build that succeeded, and only if it holds nothing but the
files an earlier build wrote (each build lists them in ``.d2l-book-files``).
"""
import argparse
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

ROOT = pathlib.Path(__file__).resolve().parents[2]  # the checkout, when run from one
MODES = ("full", "smoke", "off")
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
        return pathlib.Path(chapters).resolve()
    found = checkout_chapters()
    if found is None:
        raise InputError("no chapters folder: this d2l_multi is installed, not run from a "
                         "checkout of the chapter; pass --chapters DIR, the chapters/ folder "
                         "of a checkout (book/ beside it)")
    return found


def book_paths(chapters):
    """Return the book's sources, default output and jupyter-cache folders for the notebooks
    in ``chapters``: ``book/`` and ``_build/`` are beside it."""
    chapters = pathlib.Path(chapters)
    root = chapters.parent
    build = root / "_build"
    return {"conf": root / "book", "chapters": chapters, "out": build / "html",
            "cache_full": build / "jupyter_cache", "cache_smoke": build / "jupyter_cache_smoke",
            "jax_cache": build / "jax_cache"}


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
        for cell in json.loads(pathlib.Path(nb).read_text(encoding="utf-8"))["cells"]:
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


def build_book(out=None, mode="full", chapters=None, rerun=False, quiet=False):
    """Build the book of the notebooks in ``chapters`` (default: the checkout's) into ``out``
    (default ``_build/html`` beside it) and return ``(index, rows)``.

    ``mode`` is 'full' (execute through the cache), 'smoke' (``D2L_MULTI_SMOKE=1``, its own
    cache) or 'off' (no execution). ``rows`` lists each executed notebook's run time. Raises
    RuntimeError when Sphinx reports a warning or an error; ``out`` is then left as it was.
    An existing ``out`` is replaced only if it is empty or an earlier build of the book.
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
    out = pathlib.Path(out or paths["out"]).resolve()
    reports = out.parent / f"{out.name}-reports"
    check_replaceable(out)
    check_replaceable(reports)
    out.parent.mkdir(parents=True, exist_ok=True)
    cache = paths["cache_smoke" if mode == "smoke" else "cache_full"]
    if rerun and cache.exists():
        shutil.rmtree(cache)
    if rerun:  # every program compiled afresh too
        shutil.rmtree(paths["jax_cache"], ignore_errors=True)
    kernel_env = compilation_cache_env(paths["jax_cache"]) if mode != "off" else {}
    overrides = {"nb_execution_mode": "off" if mode == "off" else "cache",
                 "nb_execution_cache_path": str(cache), "d2l_book_mode": mode}
    shutil.rmtree(reports, ignore_errors=True)  # an earlier build's (check_replaceable)
    saved_env = os.environ.get("D2L_MULTI_SMOKE")
    work = pathlib.Path(tempfile.mkdtemp(prefix=f".{out.name}-building-", dir=out.parent))
    try:
        src, html = work / "src", work / "html"
        stage_sources(chapters, src)
        if mode == "smoke":
            os.environ["D2L_MULTI_SMOKE"] = "1"
        else:
            os.environ.pop("D2L_MULTI_SMOKE", None)  # a full build must not run in smoke mode
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
        rows = execution_table(app, started) if mode != "off" else []
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
        if mode != "off" and cache.exists():
            forget_staged_notebooks(cache)
    return out / "index.html", rows


def forget_staged_notebooks(cache):
    """Drop the cache's records of staged notebooks that are gone (executed ones stay cached)."""
    from jupyter_cache import get_cache
    cache = get_cache(str(cache))
    for record in cache.list_project_records():
        if not pathlib.Path(record.uri).exists():
            cache.remove_nb_from_project(record.pk)


HELP = "build the chapter as an HTML book"
DESCRIPTION = ("Build the chapter as a book (HTML) from book/ and chapters/*.ipynb. By default "
               "every notebook is executed (cached by jupyter-cache: a rebuild re-runs only "
               "notebooks whose code changed). An installed d2l_multi has no notebooks: pass "
               "--chapters, the chapters/ folder of a checkout.")


def configure(parser: argparse.ArgumentParser) -> None:
    """The options of ``python -m d2l_multi book``."""
    how = parser.add_mutually_exclusive_group()
    how.add_argument("--smoke", action="store_true",
                     help="execute with D2L_MULTI_SMOKE=1 (quick; numbers are not results)")
    how.add_argument("--no-execute", action="store_true",
                     help="do not execute: pages show the code without outputs")
    parser.add_argument("--chapters", type=pathlib.Path, default=None, metavar="DIR",
                        help="the notebooks, with the book's book/ folder beside DIR (default: "
                             "chapters/ of the checkout d2l_multi runs from)")
    parser.add_argument("--out", type=pathlib.Path, default=None,
                        help="output folder (default: _build/html beside the chapters folder)")
    parser.add_argument("--rerun", action="store_true",
                        help="empty this mode's execution cache (and JAX's compilation cache) "
                             "first, e.g. after changing d2l_multi (the cache only notices "
                             "changes to the notebooks)")
    parser.add_argument("--quiet", "-q", action="store_true", help="print only warnings")


def versions():
    """'python 3.11.7, jax 0.10.2, ...': the versions that decide what the notebooks compute."""
    import platform
    from importlib import metadata
    found = [f"python {platform.python_version()}"]
    for name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain", "keras"):
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    return ", ".join(found)


def run(args: argparse.Namespace) -> int:
    """Build the book as ``args`` say; return the exit status."""
    mode = "smoke" if args.smoke else "off" if args.no_execute else "full"
    chapters = chapters_folder(args.chapters)
    start = time.perf_counter()
    if mode != "off":  # execution times mean something only next to the machine that ran them
        from ..hardware import describe_machine
        print(f"machine before the build: {describe_machine()}\n{versions()}")
    try:
        index, rows = build_book(args.out, mode, chapters, rerun=args.rerun, quiet=args.quiet)
    except (RuntimeError, FileNotFoundError, FileExistsError) as err:
        print(f"book: {err}", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - start
    if rows:
        print(format_table(rows))
    print(f"book ({mode} build) written to {index.parent} in {seconds:.0f} s; "
          f"open {index}")
    return 0
