"""The tests run in a sandbox that depends on nothing this machine happens to have.

* Every test process sees 8 simulated CPU devices (or the accelerators, where there are at
  least two).
* HOME, the cache, configuration and Jupyter folders are empty temporary folders, so no
  user's data copy, kernel, IPython profile or matplotlib setting changes a result. Data come
  from ``D2L_MULTI_DATA`` when it is set, else from the sample shipped in
  ``d2l_multi/sample_data`` (with the smoke switch on, a run uses exactly the sample's examples
  either way), never from the network.
* No process the tests start (notebook kernels and commands included) can open a network
  connection beyond this machine, and in each a deprecation warning from the chapter's code or
  the libraries it teaches is an error, as every deprecation is in the test process
  (``filterwarnings`` in pyproject.toml); tests/sandbox/.
* A notebook whose kernel loses a request or a reply fails at once, naming the cell
  (tests/kernel_watchdog.py), instead of waiting out the cell timeout; and the notebook
  client sends nothing on the shell channel while it waits for a reply there, as in the book
  build (``d2l_multi.commands.book.keep_widget_output_in_cells``).
* Each test process (one per pytest-xdist worker), with the notebook kernels and programs
  its tests start, has a JAX persistent compilation cache for the run, so a program several
  notebooks and tests compile alike, such as LeNet's data-parallel step, is compiled once per
  worker. Not one for all: JAX writes an entry in place, without a lock, so a process could
  read another's half-written entry, and JAX then prints an error to stderr, which tests read.

Everything is removed at the end of the run.
"""
import atexit
import os
import pathlib
import shutil
import sys
import tempfile

import pytest

TESTS = pathlib.Path(__file__).resolve().parent
SANDBOX = TESTS / "sandbox"
sys.path[:0] = [str(SANDBOX), str(TESTS)]
import sandbox_rules  # noqa: E402

_root = pathlib.Path(tempfile.mkdtemp(prefix="d2l_multi_tests_"))
atexit.register(shutil.rmtree, _root, ignore_errors=True)
for _name, _sub in [("HOME", "home"), ("XDG_CACHE_HOME", "cache"), ("XDG_CONFIG_HOME", "config"),
                    ("XDG_DATA_HOME", "share"), ("MPLCONFIGDIR", "matplotlib"),
                    ("JUPYTER_CONFIG_DIR", "jupyter"), ("IPYTHONDIR", "ipython")]:
    (_root / _sub).mkdir()
    os.environ[_name] = str(_root / _sub)
os.environ["PYTHONPATH"] = os.pathsep.join(
    [str(SANDBOX)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p])
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("KERAS_BACKEND", "jax")
# Set before JAX starts. An xdist worker inherits the main process's folder and takes its own.
if "JAX_COMPILATION_CACHE_DIR" not in os.environ or "D2L_MULTI_TESTS_JAX_CACHE" in os.environ:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(_root / "jax_cache")
    os.environ["D2L_MULTI_TESTS_JAX_CACHE"] = "1"  # this folder is the tests', not a reader's
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
    os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "-1")

import kernel_watchdog  # noqa: E402

import d2l_multi  # noqa: E402
import d2l_multi.commands.book  # noqa: E402

d2l_multi.simulate_devices(8)
kernel_watchdog.install()
d2l_multi.commands.book.keep_widget_output_in_cells()


def pytest_configure(config):
    config.addinivalue_line("markers", "needs_full_data: the test reads all of Fashion-MNIST "
                                       "and MNIST; skipped when no full copy is found")


@pytest.fixture(autouse=True, scope="session")
def no_network():
    """A test that tries to reach the network fails with an OSError instead."""
    sandbox_rules.block_network()
    yield
    sandbox_rules.allow_network()


def _full_copies():
    from d2l_multi import data
    return all(data.find_dataset(name) is not None for name in ("fashion-mnist", "mnist"))


# Test files that take more than about 20 s on 2 cores: they build the book, run the benchmark
# commands, grade a classroom or launch jobs of several processes.
SLOW_FILES = {"test_benchmark.py", "test_book.py", "test_classroom.py", "test_distributed.py"}


def pytest_collection_modifyitems(config, items):
    """The notebooks (nbmake) and the slow test files are marked ``slow``, so that
    ``-m "not slow"`` gives a quick run. The few tests of the full data sets skip, saying how
    to provide them, when there is no local copy (the tests never download)."""
    for item in items:
        if item.path.suffix == ".ipynb" or item.path.name in SLOW_FILES:
            item.add_marker(pytest.mark.slow)
    if _full_copies():
        return
    skip = pytest.mark.skip(reason="no full local copy of Fashion-MNIST and MNIST: set "
                                   "D2L_MULTI_DATA to a folder holding fashion-mnist/ and "
                                   "mnist/ to run it")
    for item in items:
        if item.get_closest_marker("needs_full_data"):
            item.add_marker(skip)
