"""Book and library cannot drift: every ``#@save`` cell's functions and classes are the
library's source, character for character (as d2l does with its ``#@save`` cells)."""
import ast
import inspect
import json
import pathlib

import pytest

import d2l_multi

CHAPTERS = pathlib.Path(__file__).resolve().parent.parent / "chapters"


def saved_definitions():
    for nb in sorted(CHAPTERS.glob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            src = "".join(cell["source"])
            if cell["cell_type"] != "code" or not src.lstrip().startswith("#@save"):
                continue
            for node in ast.parse(src).body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    seg = ast.get_source_segment(src, node)
                    start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
                    seg = "\n".join(src.splitlines()[start - 1:node.end_lineno])
                    yield pytest.param(nb.name, node.name, seg, id=f"{nb.stem}::{node.name}")


SAVED = list(saved_definitions())


def test_chapters_save_code():
    assert SAVED, "no #@save cells found in chapters/"


@pytest.mark.parametrize("notebook,name,cell_source", SAVED)
def test_saved_cell_equals_library(notebook, name, cell_source):
    assert hasattr(d2l_multi, name), (
        f"{notebook} saves {name!r} but d2l_multi does not export it")
    obj = inspect.unwrap(getattr(d2l_multi, name))
    lib_source = inspect.getsource(obj).rstrip("\n")
    assert cell_source.rstrip("\n") == lib_source, (
        f"{notebook}: the cell defining {name} differs from "
        f"{inspect.getsourcefile(obj)}; copy one into the other")
