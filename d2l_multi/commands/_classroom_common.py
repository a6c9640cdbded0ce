"""What the classroom commands share (commands/classroom.py builds, commands/grading.py
grades): nbgrader's markers, the notebook metadata key, the error, and nbgrader itself."""
import pathlib
import sys

from ..errors import InputError

BEGIN_HIDDEN, END_HIDDEN = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"
NOTEBOOK_KEY = "d2l_multi"  # notebook metadata: {"notebook": the book notebook's name}


class ClassroomError(InputError):
    """A notebook or a folder that the classroom commands cannot use, and why."""


def _fresh(folder, what):
    folder = pathlib.Path(folder)
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise ClassroomError(f"{what} {folder} exists and is not an empty folder: choose a new "
                             f"one (nothing is overwritten)")
    return folder


def _nbgrader_command(*args):
    import importlib.util
    if importlib.util.find_spec("nbgrader") is None:
        raise ClassroomError("the classroom commands need nbgrader: pip install -e "
                             "\".[classroom]\" (or pip install nbgrader)")
    return [sys.executable, "-m", "nbgrader", *args]
