"""The book builds from the notebooks' stored outputs (nothing executed, warnings are errors)
and reads well in headless Chromium.

Every page is served from 127.0.0.1 and must load with no console error, no failed request and
no request anywhere else (fonts, MathJax and scripts are all local); images have a size, math
is typeset, the worked solutions stay closed until clicked, and the landing page links every
notebook in order. Screenshots of the landing page and of notebook 03 go to
``$D2L_MULTI_ARTIFACTS`` (default ``_build/screenshots``). Without Chromium the tests skip.
"""
import fcntl
import functools
import http.server
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading

import pytest

from d2l_multi import commands
from d2l_multi.commands import book as book_module
from d2l_multi.commands.book import build_book

ROOT = pathlib.Path(__file__).resolve().parent.parent
NOTEBOOKS = sorted(p.stem for p in (ROOT / "chapters").glob("*.ipynb"))
DATA_PARALLEL = "03_data_parallel_from_scratch"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-default-apps", "--disable-extensions"]
# Inline math is typeset from \( \) and display math from \[ \]; left in the text, they (or
# $...$) would mean MathJax did not run. Code is excluded: shell snippets use $.
RAW_MATH = re.compile(r"\\\(|\\\)|\\\[|\\\]|\$[^$\s][^$]*\$")
VISIBLE_PROSE = """() => {
  const body = document.querySelector('article.bd-article').cloneNode(true);
  body.querySelectorAll('pre, code, mjx-container, script, style, details:not([open])')
      .forEach(e => e.remove());
  return body.innerText;
}"""


def main(argv):
    """``python -m d2l_multi book ARGV``, in this process; its exit status."""
    return commands.main(["book", *argv])


def chromium_path():
    for candidate in (os.environ.get("D2L_MULTI_CHROMIUM"), "chromium", "chromium-browser",
                      "google-chrome"):
        if candidate and shutil.which(candidate):
            return shutil.which(candidate)
    return None


@pytest.fixture(scope="module")
def book(tmp_path_factory, worker_id):
    """The built book, built once per test session (xdist workers share it under a lock).

    ``D2L_MULTI_BOOK=DIR`` checks a book built before instead, e.g. an executed one
    (``python -m d2l_multi book --smoke && D2L_MULTI_BOOK=_build/html-smoke pytest
    tests/test_book.py``).
    """
    if os.environ.get("D2L_MULTI_BOOK"):
        return pathlib.Path(os.environ["D2L_MULTI_BOOK"]).resolve()
    if worker_id == "master":
        base = tmp_path_factory.mktemp("book")
    else:
        base = tmp_path_factory.getbasetemp().parent  # shared by the session's workers
    out = base / "book-html"
    with open(base / "book.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "index.html").exists():
            build_book(out, mode="stored", quiet=True)
    return out


@pytest.fixture(scope="module")
def site(book):
    """Base URL of the book served by http.server on 127.0.0.1."""
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(Quiet, directory=str(book)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def browser():
    path = chromium_path()
    if path is None:
        pytest.skip("Chromium is missing: install it (Debian/Ubuntu: apt-get install chromium) "
                    "or set D2L_MULTI_CHROMIUM to a Chromium or Chrome binary")
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason='Playwright is missing: pip install -e ".[browser]"')
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=path, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


class Visit:
    """A fresh page that records console errors, failed and outside requests."""

    def __init__(self, browser, site):
        self.site, self.problems = site, []
        self.context = browser.new_context(viewport={"width": 1280, "height": 900})
        self.page = self.context.new_page()
        self.page.on("console", lambda m: m.type == "error" and
                     self.problems.append(f"console error: {m.text}"))
        self.page.on("pageerror", lambda e: self.problems.append(f"script error: {e}"))
        self.page.on("requestfailed", lambda r: self.problems.append(
            f"request failed: {r.url} ({r.failure})"))
        self.page.on("response", lambda r: r.status >= 400 and self.problems.append(
            f"HTTP {r.status}: {r.url}"))
        self.page.on("request", self.check_local)

    def check_local(self, request):
        url = request.url
        if not (url.startswith(self.site) or url.startswith(("data:", "blob:", "about:"))):
            self.problems.append(f"request leaves the local server: {url}")

    def open(self, path):
        self.page.goto(self.site + path, wait_until="networkidle")
        self.page.evaluate("() => document.fonts.ready")
        if self.page.evaluate("() => window.MathJax !== undefined"):
            try:
                self.page.wait_for_function(
                    "() => window.MathJax.startup && window.MathJax.startup.promise",
                    timeout=15_000)
                self.page.evaluate("() => MathJax.startup.promise")
            except Exception as err:  # reported with the page's other problems
                self.problems.append(f"MathJax did not start: {err}")
        return self.page

    def close(self):
        self.context.close()


@pytest.fixture
def visit(browser, site):
    visits = []

    def make():
        visits.append(Visit(browser, site))
        return visits[-1]

    yield make
    for v in visits:
        v.close()


def artifacts_dir():
    path = pathlib.Path(os.environ.get("D2L_MULTI_ARTIFACTS") or ROOT / "_build" / "screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


def test_importing_the_package_does_not_import_sphinx():
    code = ("import sys, d2l_multi, d2l_multi.commands.book; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'sphinx', 'myst_nb'}))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT).stdout
    assert out.strip() == "[]", f"import d2l_multi pulled in {out.strip()}"


def test_book_command_refuses_bad_options_and_foreign_folders(tmp_path, capsys):
    assert main(["--smoke", "chapters/00_devices.ipynb"]) == 2
    (tmp_path / "notes.txt").write_text("mine")
    assert main(["--out", str(tmp_path)]) == 1
    assert "holds files that no build of the book wrote (notes.txt)" in capsys.readouterr().err
    assert (tmp_path / "notes.txt").read_text() == "mine"


def test_the_kernels_of_a_build_share_one_compilation_cache(tmp_path):
    """A program compiled in one kernel is read from the cache in the next: with these
    variables (set by build_book for the kernels it starts) JAX writes every program there."""
    from d2l_multi.commands.book import compilation_cache_env
    env = compilation_cache_env(tmp_path / "jax_cache", {})
    assert env["JAX_COMPILATION_CACHE_DIR"] == str(tmp_path / "jax_cache")
    assert "JAX_COMPILATION_CACHE_DIR" not in compilation_cache_env(
        tmp_path, {"JAX_COMPILATION_CACHE_DIR": "/theirs"})           # a reader's own stays
    code = ("import jax, jax.numpy as jnp\n"
            "print(float(jax.jit(lambda x: (x * 2).sum())(jnp.ones(3))))")
    clean = {k: v for k, v in os.environ.items() if not k.startswith("JAX_")}
    subprocess.run([sys.executable, "-c", code], env={**clean, **env}, check=True,
                   capture_output=True)
    assert any((tmp_path / "jax_cache").iterdir())


def test_only_a_folder_holding_nothing_but_an_earlier_build_is_replaced(book, tmp_path,
                                                                         capsys):
    """A stray .buildinfo does not make a folder a book: the build refuses it and its files
    stay. A build lists the files it wrote; one more file makes its folder the user's."""
    stray = tmp_path / "stray"
    stray.mkdir()
    (stray / ".buildinfo").write_text("x")
    (stray / "notes.txt").write_text("mine")
    assert main(["--quiet", "--out", str(stray)]) == 1
    err = capsys.readouterr().err
    assert f"{stray} holds files that no build of the book wrote (.buildinfo, notes.txt)" in err
    assert sorted(p.name for p in stray.iterdir()) == [".buildinfo", "notes.txt"]
    earlier = tmp_path / "earlier"
    shutil.copytree(book, earlier)
    book_module.check_replaceable(earlier)  # nothing but what the build wrote
    (earlier / "_static" / "mine.css").write_text("mine")
    with pytest.raises(FileExistsError, match=r"holds files that no build of the book wrote "
                                              r"\(_static/mine.css\)"):
        book_module.check_replaceable(earlier)


def test_a_reports_folder_that_a_build_did_not_write_is_kept(tmp_path, capsys):
    reports = tmp_path / "site-reports"
    reports.mkdir()
    (reports / "mine.txt").write_text("mine")
    assert main(["--quiet", "--out", str(tmp_path / "site")]) == 1
    err = capsys.readouterr().err
    assert f"{reports} holds files that no build of the book wrote (mine.txt)" in err
    assert (reports / "mine.txt").read_text() == "mine" and not (tmp_path / "site").exists()


def test_a_mount_point_is_refused_before_building(tmp_path, capsys):
    mount = tmp_path / "mnt"
    mount.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(mount)],
                                           capture_output=True).returncode:
        pytest.skip("needs root to mount a folder")
    try:
        assert main(["--quiet", "--out", str(mount)]) == 1
    finally:
        subprocess.run(["umount", str(mount)], check=True)
    err = capsys.readouterr().err
    assert f"{mount} is a mount point, which the build cannot replace; pass --out a folder " \
           f"inside it" in err


@pytest.mark.parametrize("link", ["img/../../../../../../outside.txt", "/etc/hostname",
                                  "..%2F..%2Foutside.txt"])
def test_a_notebook_link_that_leaves_the_chapters_is_refused(tmp_path, link):
    """Sphinx copies what a page links to into the book: a link is resolved first."""
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "conf.py").write_text("")
    (tmp_path / "chapters").mkdir()
    cell = {"cell_type": "markdown", "metadata": {}, "source": [f"See ![x]({link}) there."]}
    notebook = {"cells": [cell], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    (tmp_path / "chapters" / "01_x.ipynb").write_text(json.dumps(notebook))
    with pytest.raises(OSError, match=r"01_x\.ipynb links to .*outside|01_x\.ipynb links to "
                                      r"/etc/hostname") as e:
        book_module.stage_sources(tmp_path / "chapters", tmp_path / "staged")
    assert "leaves" in str(e.value) and "\n" not in str(e.value)


def test_a_missing_book_extra_names_the_install_command(tmp_path):
    code = ("import sys; sys.modules['myst_nb'] = None\n"  # as if myst-nb were not installed
            "from d2l_multi.commands import main; sys.exit(main(sys.argv[1:]))")
    result = subprocess.run([sys.executable, "-c", code, "book", "--out",
                             str(tmp_path / "site")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 1, result.stderr
    assert "the book needs myst_nb" in result.stderr
    assert 'pip install -e ".[book]"' in result.stderr and "Traceback" not in result.stderr


def test_the_book_shows_the_stored_outputs_and_names_the_stale_notebooks(tmp_path):
    """Nothing is executed: a page shows what its notebook stores, and the banner names the
    notebooks whose outputs are not those of a full run of their current code (here a copy of
    the chapter, with a stored output given to the first notebook and taken from the second)."""
    import nbformat
    shutil.copytree(ROOT / "book", tmp_path / "book")
    shutil.copytree(ROOT / "chapters", tmp_path / "chapters")
    first, second = (tmp_path / "chapters" / f"{name}.ipynb" for name in NOTEBOOKS[:2])
    nb = nbformat.read(first, as_version=4)
    cell = next(c for c in nb.cells if c.cell_type == "code")
    cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text="stored 4242\n")]
    nb.metadata["d2l_multi"] = {"run": {"code_hash": book_module.code_hash(nb), "smoke": False,
                                        "outputs_hash": book_module.outputs_hash(nb)}}
    nbformat.write(nb, first)
    nb = nbformat.read(second, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    nbformat.write(nb, second)
    stale = book_module.stale_notebooks(tmp_path / "chapters")
    assert NOTEBOOKS[1] in stale and NOTEBOOKS[0] not in stale
    index, rows = build_book(tmp_path / "html", "stored", tmp_path / "chapters", quiet=True)
    assert rows == [] and not (tmp_path / "_build").exists()  # no execution, no cache
    page = (tmp_path / "html" / "chapters" / f"{NOTEBOOKS[0]}.html").read_text()
    assert "stored 4242" in page
    banner = f"{len(stale)} of the notebooks lack the outputs of a full run of their current"
    assert banner in index.read_text()


PAGES = ["index.html"] + [f"chapters/{name}.html" for name in NOTEBOOKS]


@pytest.mark.parametrize("path", PAGES)
def test_page_loads_offline_with_images_and_math(visit, path):
    v = visit()
    page = v.open(path)
    # a network request that the page would make later (lazy images) counts too
    page.evaluate("() => window.scrollTo(0, document.body.scrollHeight)")
    page.wait_for_load_state("networkidle")
    assert not v.problems, f"{path}:\n" + "\n".join(v.problems)

    images = page.evaluate("""() => Array.from(document.images, i =>
        [i.getAttribute('src'), i.complete, i.naturalWidth])""")
    broken = [src for src, complete, width in images if not (complete and width > 0)]
    assert not broken, f"{path}: images without size: {broken}"

    math = page.evaluate("""() => Array.from(document.querySelectorAll('.math'),
        m => m.querySelector('mjx-container') !== null)""")
    assert all(math), f"{path}: {math.count(False)} of {len(math)} formulas not typeset"
    raw = RAW_MATH.findall(page.evaluate(VISIBLE_PROSE))
    assert not raw, f"{path}: untypeset math in the text: {raw[:5]}"

    prev_next = page.evaluate("""() => [!!document.querySelector('a.left-prev'),
                                       !!document.querySelector('a.right-next')]""")
    if path == "index.html":
        assert prev_next[1], "the landing page has no link to the first notebook"
    else:
        assert prev_next[0], f"{path}: no link to the previous page"
        assert prev_next[1] or path == PAGES[-1], f"{path}: no link to the next page"


def test_landing_page_has_math_a_figure_and_every_notebook_in_order(visit):
    v = visit()
    page = v.open("index.html")
    assert page.locator("mjx-container").count() >= 2, "the landing page's math is missing"
    figure = page.locator("figure img")
    assert figure.count() >= 1 and figure.first.evaluate("i => i.naturalWidth") > 0
    links = page.evaluate("""() => Array.from(
        document.querySelectorAll('article .toctree-wrapper a.reference.internal'),
        a => a.getAttribute('href'))""")
    linked = [re.sub(r"\.html(#.*)?$", "", h).split("/")[-1] for h in links]
    # the core track in order, then the electives and the appendix, then the page for teachers
    core = ["00_devices", "01_lenet_from_scratch", "02_allreduce",
            "03_data_parallel_from_scratch", "04a_jit_and_shardings", "04b_shard_map",
            "07b_predicting_steps", "09_sharded_matmuls"]
    rest = [name for name in NOTEBOOKS if name not in core]
    assert linked == core + rest + ["teaching"], f"landing page links {linked}"
    shot = artifacts_dir() / "book-landing.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")


def test_solutions_stay_closed_until_the_reader_opens_them(visit):
    v = visit()
    page = v.open(f"chapters/{DATA_PARALLEL}.html")
    heading = page.locator("section#solutions > h2")
    assert heading.is_visible(), "the Solutions heading should be visible"
    box = page.locator("section#solutions > details.d2l-solutions")
    assert box.count() == 1, "everything under ## Solutions belongs in one toggle"
    assert not box.evaluate("d => d.open")
    first_solution = box.locator(":scope > :not(summary)").first
    assert not first_solution.is_visible(), "solutions are visible before the toggle is opened"
    shot = artifacts_dir() / f"book-{DATA_PARALLEL}.png"
    page.screenshot(path=str(shot), full_page=True)
    print(f"screenshot: {shot}")

    box.locator("summary").click()
    assert box.evaluate("d => d.open")
    assert first_solution.is_visible(), "the opened toggle does not show the solutions"
    assert box.locator("div.cell").count() >= 1, "the solutions' code cells are not in the toggle"
    assert not v.problems, "\n".join(v.problems)


def test_notebook_page_links_its_ipynb_and_cites_into_its_own_references(visit, site):
    v = visit()
    page = v.open(f"chapters/{DATA_PARALLEL}.html")
    href = page.locator("a.d2l-download-notebook").get_attribute("href")
    response = page.request.get(site + "chapters/" + href)
    assert response.ok, f"{href}: HTTP {response.status}"
    notebook = json.loads(response.text())
    assert notebook["nbformat"] == 4 and notebook["cells"]
    downloads = page.evaluate("""() => Array.from(
        document.querySelectorAll('.dropdown-download-buttons a'), a => a.href)""")
    assert any(url.endswith(f"{DATA_PARALLEL}.ipynb") for url in downloads), downloads

    citations = page.locator("span.bibtex-citation a")
    assert citations.count() >= 1, "notebook 03 cites no work"
    target = citations.first.get_attribute("href")
    assert target.startswith("#"), f"citation links to another page: {target}"
    entry = page.locator(f"section#references {target}")
    assert entry.count() == 1, f"{target} is not in the page's own References section"
    assert not v.problems, "\n".join(v.problems)


def test_search_works_offline(visit):
    v = visit()
    page = v.open("search.html?q=allreduce")
    page.wait_for_selector("#search-results li", timeout=15_000)
    hits = page.evaluate("""() => Array.from(document.querySelectorAll('#search-results li a'),
        a => a.getAttribute('href'))""")
    assert any("02_allreduce" in h for h in hits), hits
    assert not v.problems, "\n".join(v.problems)
