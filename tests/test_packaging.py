"""pyproject.toml and environment.yml describe the same environment; the commands that the
README and CI name exist."""
import os
import pathlib
import re
import shutil
import site
import subprocess
import sys
import tomllib
import zipfile

import pytest

from d2l_multi import commands
from d2l_multi.commands import book, classroom
from d2l_multi.errors import InputError

ROOT = pathlib.Path(__file__).resolve().parent.parent
SANDBOX = ROOT / "tests" / "sandbox"

EMPTY_NOTEBOOK = '{"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}'


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
    """environment.yml = dependencies + Jupyter (the notebooks extra) + the test extra, which
    includes the book extra and the classroom extra (the tests build the student edition and
    grade submissions), but not the browser extra (the opt-in browser test)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    for name in ("book", "classroom"):
        assert f"{project['name']}[{name}]" in project["optional-dependencies"]["test"]
    wanted = set(project["dependencies"]) | extra(project, "notebooks") | extra(project, "test")
    assert extra(project, "book") | extra(project, "classroom") <= wanted
    listed = environment_pip_list()
    assert "-e ." in listed and "-c constraints.txt" in listed
    assert set(listed) - {"-e .", "-c constraints.txt"} == wanted
    assert "python=3.11" in (ROOT / "environment.yml").read_text()


def test_the_commands_that_readme_and_ci_name_exist():
    """Every ``python -m d2l_multi ...`` command the README, docs/ and .ci/run name answers
    --help, every extra they install exists, and .ci/run is valid bash."""
    text = "".join(p.read_text() for p in [ROOT / "README.md", ROOT / ".ci/run",
                                           *sorted((ROOT / "docs").glob("*.md"))])
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = {name for names in re.findall(r'pip install (?:-q )?-e "\.\[([\w,$]+)\]"', text)
              for name in names.split(",") if not name.startswith("$")}
    assert extras and extras <= set(project["optional-dependencies"]), extras
    commands = {tuple(c.split()) for c in re.findall(r"python -m (d2l_multi(?:\.\w+| \w+)?)",
                                                      text)}
    assert ("d2l_multi", "launch") in commands and ("d2l_multi.mp_train",) in commands
    for command in sorted(commands):
        result = subprocess.run([sys.executable, "-m", *command, "--help"], cwd=ROOT,
                                capture_output=True, text=True, timeout=120)
        assert result.returncode == 0, (command, result.stderr[-2000:])
    assert subprocess.run(["bash", "-n", str(ROOT / ".ci/run")]).returncode == 0


def test_relative_links_of_readme_and_docs_resolve():
    """A link from README.md or docs/*.md to a file of the repository names one that exists
    (renamed notebooks and moved pages leave no dead link behind)."""
    dead = []
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
                 *sorted((ROOT / "book").glob("*.md"))]:
        text = re.sub(r"`[^`\n]*`", "", page.read_text())  # examples in code are not links
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            path = target.split("#")[0]
            if not path or re.match(r"[a-z]+:", path):
                continue
            # the book stages book/ and chapters/ side by side: its pages link chapters/...
            where = [page.parent] + ([ROOT] if page.parent.name == "book" else [])
            if not any((base / path).exists() for base in where):
                dead.append(f"{page.relative_to(ROOT)} -> {target}")
    assert not dead, dead


def run(*args, **kwargs):
    result = subprocess.run([str(a) for a in args], capture_output=True, text=True,
                            timeout=600, **kwargs)
    assert result.returncode == 0, (args, result.stdout[-2000:], result.stderr[-3000:])
    return result


@pytest.fixture(scope="module")
def wheel(tmp_path_factory):
    """The wheel ``pip wheel . --no-deps`` builds, from a copy of the checkout (the build
    writes nothing into the checkout) with its tests/ and chapters/."""
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    shutil.copytree(ROOT, src, ignore=shutil.ignore_patterns(
        ".git", ".venv", "_build", "build", "runs", "*.egg-info", "__pycache__"))
    run(sys.executable, "-m", "pip", "wheel", src, "--no-deps", "--no-build-isolation",
        "--no-index", "--wheel-dir", tmp / "dist")
    (path,) = (tmp / "dist").glob("d2l_multi-*.whl")
    return path


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory):
    """The Python of a new virtual environment where the wheel is installed (without its
    dependencies) and the packages of this one are importable, but not this checkout's
    d2l_multi: its site-packages are on the path, their .pth files (an editable install's
    hook) are not run."""
    venv = tmp_path_factory.mktemp("venv") / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", venv)
    python = venv / "bin" / "python"
    purelib = pathlib.Path(run(python, "-c", "import sysconfig; "
                                             "print(sysconfig.get_path('purelib'))").stdout.strip())
    (purelib / "test_environment.pth").write_text(
        "".join(f"{p}\n" for p in site.getsitepackages()))
    run(sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
        wheel)
    return python


def outside_env():
    """The environment of a process run outside the checkout: only the sandbox on PYTHONPATH
    (no network), no checkout."""
    keep = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
            if p and pathlib.Path(p).resolve() == SANDBOX]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(keep)}


@pytest.mark.slow
def test_the_wheel_holds_the_package_and_nothing_of_the_checkout(wheel):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = zipfile.ZipFile(wheel).namelist()
    assert {name.split("/")[0] for name in names} == {
        "d2l_multi", f"d2l_multi-{project['version']}.dist-info"}   # no tests/, no chapters/
    shipped = {name for name in names if name.startswith("d2l_multi/")}
    sources = {p.relative_to(ROOT).as_posix() for p in (ROOT / "d2l_multi").rglob("*.py")}
    assert sources <= shipped, sorted(sources - shipped)[:5]  # the commands and exercises too
    assert "d2l_multi/sample_data/fashion-mnist/train-images-idx3-ubyte.gz" in shipped
    assert not [name for name in names if "__pycache__" in name or name.endswith(".ipynb")]


@pytest.mark.slow
def test_the_installed_wheel_runs_its_commands_outside_the_checkout(installed, tmp_path):
    env = outside_env()
    where = run(installed, "-c", "import d2l_multi; print(d2l_multi.__file__)", cwd=tmp_path,
                env=env).stdout
    assert pathlib.Path(where).resolve().is_relative_to(installed.parent.parent)
    assert not pathlib.Path(where).resolve().is_relative_to(ROOT)
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    version = run(installed, "-m", "d2l_multi", "--version", cwd=tmp_path, env=env).stdout
    assert version.split() == ["d2l-multi", project["version"]]
    assert "--epochs" in run(installed, "-m", "d2l_multi", "train", "--help", cwd=tmp_path,
                             env=env).stdout


@pytest.mark.slow
def test_without_a_checkout_book_and_classroom_ask_for_the_notebooks(installed, tmp_path):
    """An installed package has no chapters/: book and classroom say so in one line and how
    to name the notebooks (exit status 2), instead of looking beside site-packages."""
    env = outside_env()
    for command, option in [(["book"], "--chapters"),
                            (["classroom", "student", tmp_path / "student"], "notebooks")]:
        result = subprocess.run([installed, "-m", "d2l_multi", *map(str, command)],
                                capture_output=True, text=True, cwd=tmp_path, env=env,
                                timeout=300)
        assert result.returncode == 2, (command, result.stderr[-2000:])
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "checkout" in lines[0] and option in lines[0], lines
    assert not (tmp_path / "student").exists()


def test_book_and_classroom_take_the_checkouts_chapters_by_default():
    assert book.chapters_folder() == ROOT / "chapters"
    assert classroom._notebooks([]) == sorted((ROOT / "chapters").glob("*.ipynb"))


def test_book_and_classroom_take_the_chapters_they_are_given(tmp_path):
    (tmp_path / "book").mkdir()
    (tmp_path / "book" / "conf.py").write_text("")
    (tmp_path / "notebooks").mkdir()
    for name in ("b.ipynb", "a.ipynb"):
        (tmp_path / "notebooks" / name).write_text(EMPTY_NOTEBOOK)
    assert book.stage_sources(tmp_path / "notebooks", tmp_path / "src") == ["a", "b"]
    assert sorted(p.name for p in (tmp_path / "src" / "chapters").iterdir()) == [
        "a.ipynb", "b.ipynb"]
    assert book.book_paths(tmp_path / "notebooks")["out"] == tmp_path / "_build" / "html"
    assert classroom._notebooks([tmp_path / "notebooks"]) == [
        tmp_path / "notebooks" / "a.ipynb", tmp_path / "notebooks" / "b.ipynb"]


def test_a_chapters_folder_without_book_beside_it_is_refused(tmp_path, capsys):
    (tmp_path / "chapters").mkdir()
    (tmp_path / "chapters" / "a.ipynb").write_text(EMPTY_NOTEBOOK)
    assert commands.main(["book", "--chapters", str(tmp_path / "chapters"),
                          "--out", str(tmp_path / "html")]) == 1
    assert f"{tmp_path / 'book' / 'conf.py'} is missing" in capsys.readouterr().err


def test_without_a_checkout_book_and_classroom_name_the_way_to_pass_notebooks(
        monkeypatch, tmp_path, capsys):
    """As from a wheel: no chapters/ beside the package. One line, exit status 2."""
    monkeypatch.setattr(book, "ROOT", tmp_path)
    monkeypatch.setattr(classroom, "CHAPTERS", tmp_path / "chapters")
    with pytest.raises(InputError, match="--chapters"):
        book.build_book(tmp_path / "html", mode="stored")
    assert commands.main(["book"]) == 2
    assert commands.main(["classroom", "student", str(tmp_path / "student")]) == 2
    book_line, classroom_line = capsys.readouterr().err.strip().splitlines()
    assert "installed, not run from a checkout" in book_line and "--chapters" in book_line
    assert "installed, not run from a checkout" in classroom_line
    assert not (tmp_path / "student").exists() and not (tmp_path / "html").exists()


def test_a_file_that_is_not_a_notebook_is_named(tmp_path):
    (tmp_path / "a.ipynb").write_text("{}")
    with pytest.raises(InputError, match=r"a\.ipynb is not a notebook"):
        book.check_links(tmp_path, [tmp_path / "a.ipynb"])


@pytest.mark.slow
def test_a_test_that_hangs_fails_with_its_name_and_the_run_goes_on(tmp_path):
    """pyproject.toml's per-test timeout ends a test blocked outside Python (a wait XLA or a
    lock never ends) in its xdist worker; the run names it and goes on with the others."""
    (tmp_path / "test_hang.py").write_text(
        "import threading\n\n\ndef test_hangs():\n    threading.Event().wait()\n\n\n"
        "def test_after():\n    pass\n")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", ROOT / "pyproject.toml", "--rootdir", tmp_path,
         "-o", "timeout=5", "-n", "1", tmp_path / "test_hang.py"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert result.returncode == 1, result.stdout[-2000:]
    assert "crashed while running 'test_hang.py::test_hangs'" in result.stdout
    assert "1 failed, 1 passed" in result.stdout


@pytest.mark.slow
def test_each_test_process_has_a_compilation_cache_of_its_own(tmp_path):
    """JAX writes a cache entry in place, unlocked: in a folder two xdist workers (and the
    programs their tests start) shared, one could read the other's half-written entry and
    print an error that a test reading stderr counts. Each worker has its own."""
    (tmp_path / "test_cache.py").write_text(
        "import os, pathlib\n\n\ndef test_record():\n"
        "    pathlib.Path(os.environ['PYTEST_XDIST_WORKER']).write_text(\n"
        "        os.environ['JAX_COMPILATION_CACHE_DIR'])\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests"), str(ROOT)])}
    for name in ("D2L_MULTI_TESTS_JAX_CACHE", "JAX_COMPILATION_CACHE_DIR"):  # a fresh run
        env.pop(name, None)
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-c", ROOT / "pyproject.toml", "--rootdir", tmp_path,
         "-p", "conftest", "-n", "2", "--dist", "each", tmp_path / "test_cache.py"],
        capture_output=True, text=True, timeout=300, cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stdout[-2000:]
    folders = [(tmp_path / worker).read_text() for worker in ("gw0", "gw1")]
    assert folders[0] != folders[1], folders
