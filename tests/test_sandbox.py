"""The sandbox of tests/conftest.py reaches the notebook kernels and the commands the tests
start: a deprecated API fails a notebook's test, the network is out of reach, and nothing of
the machine's own HOME, cache or data is seen."""
import os
import subprocess
import sys

import nbformat
import pytest
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError


def execute(*cells):
    """Run a notebook of ``cells`` as nbmake does (nbclient, the ``python3`` kernel)."""
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    NotebookClient(nb, timeout=120, kernel_name="python3").execute()
    return nb


def test_a_notebook_runs_in_the_sandbox():
    nb = execute("import os\nprint(os.environ['HOME'] == {!r})".format(os.environ["HOME"]))
    assert nb.cells[0].outputs[0]["text"].strip() == "True"


@pytest.mark.parametrize("cell", [
    "import warnings\nwarnings.warn('old API', DeprecationWarning)",      # from the cell
    "import warnings\nwarnings.warn('soon', FutureWarning)",
    "import warnings\n"                                          # from a library it uses
    "warnings.warn_explicit('old', DeprecationWarning, 'x.py', 1, module='jax._src.x')",
])
def test_a_deprecation_warning_fails_the_notebook(cell):
    with pytest.raises(CellExecutionError, match=r"(Deprecation|Future)Warning"):
        execute(cell)


def test_the_kernel_machinery_may_warn():
    execute("import warnings\n"
            "warnings.warn_explicit('old', DeprecationWarning, 'x.py', 1, module='tornado.x')")


def test_a_kernel_cannot_reach_the_network():
    with pytest.raises(CellExecutionError, match="tests must not use the network"):
        execute("import socket\nsocket.create_connection(('192.0.2.1', 80), timeout=5)")


def test_a_command_cannot_reach_the_network_and_fails_on_deprecations():
    code = ("import socket, warnings\n"
            "try:\n    socket.create_connection(('192.0.2.1', 80), timeout=5)\n"
            "except OSError as e:\n    print(e)\n"
            "warnings.warn('old API', DeprecationWarning)\n")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=60)
    assert "tests must not use the network" in result.stdout
    assert result.returncode == 1 and "DeprecationWarning: old API" in result.stderr
