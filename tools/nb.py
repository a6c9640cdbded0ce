"""Author notebooks as percent-format Python and build them (jupytext), keeping #@save cells
equal to the library.

    python tools/nb.py build SRC.py chapters/NN_name.ipynb   # percent .py -> notebook, no outputs
    python tools/nb.py source chapters/NN_name.ipynb SRC.py  # notebook -> percent .py, to edit
    python tools/nb.py sync chapters/NN_name.ipynb           # #@save cells <- library source
    python tools/nb.py solutions chapters/*.ipynb            # apply the Solutions convention

In a source, a line ``#@src name1 name2`` is replaced by the library's source of those
``d2l_multi`` functions/classes (separated by blank lines), so a ``#@save`` cell is written as
``#@save`` + ``#@src name`` and cannot drift from the package (tests/test_book_sync.py checks).

The ``## Solutions`` heading gets a markdown cell of its own, marked
``"jp-MarkdownHeadingCollapsed": true``, so JupyterLab opens the notebook with the solutions
folded away (the book collapses them too; docs/writing.md).
"""
import inspect
import pathlib
import sys

import jupytext
import nbformat

SOLUTIONS = "## Solutions"


def expand(text):
    import d2l_multi
    out = []
    for line in text.splitlines():
        if line.startswith("#@src "):
            names = line.split()[1:]
            parts = [inspect.getsource(inspect.unwrap(getattr(d2l_multi, n))).rstrip("\n")
                     for n in names]
            out.append("\n\n\n".join(parts))
        else:
            out.append(line)
    return "\n".join(out) + "\n"


def build(src, dst):
    nb = jupytext.reads(expand(pathlib.Path(src).read_text()), fmt="py:percent")
    nb.metadata.pop("jupytext", None)
    nb.metadata["kernelspec"] = {"display_name": "Python 3", "language": "python",
                                 "name": "python3"}
    for cell in nb.cells:
        cell.metadata = {}
        if cell.cell_type == "code":
            cell.outputs, cell.execution_count = [], None
    mark_solutions(nb)
    tmp = pathlib.Path(dst).with_suffix(".tmp.ipynb")
    jupytext.write(nb, tmp, fmt="ipynb")
    tmp.replace(dst)


def sync(nb_path):
    """Rewrite every function or class of the notebook's ``#@save`` cells with the library's
    current source; print the names the library no longer has."""
    import ast
    import json

    import d2l_multi
    nb = json.loads(pathlib.Path(nb_path).read_text())
    for cell in nb["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] != "code" or not src.lstrip().startswith("#@save"):
            continue
        lines = src.splitlines()
        for node in reversed(ast.parse(src).body):
            if not isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                continue
            if not hasattr(d2l_multi, node.name):
                print(f"{nb_path}: {node.name} is not in d2l_multi")
                continue
            start = (node.decorator_list[0] if node.decorator_list else node).lineno
            new = inspect.getsource(inspect.unwrap(getattr(d2l_multi, node.name))).rstrip("\n")
            lines[start - 1:node.end_lineno] = new.splitlines()
        text = "\n".join(lines)
        cell["source"] = [line + "\n" for line in text.split("\n")]
        cell["source"][-1] = cell["source"][-1].rstrip("\n")
    pathlib.Path(nb_path).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
def mark_solutions(nb):
    """Give the ``## Solutions`` heading its own cell, collapsed in JupyterLab."""
    cells = []
    for cell in nb.cells:
        lines = [line.rstrip() for line in cell.source.split("\n")]
        if cell.cell_type != "markdown" or SOLUTIONS not in lines:
            cells.append(cell)
            continue
        k = lines.index(SOLUTIONS)
        before, after = "\n".join(lines[:k]).strip("\n"), "\n".join(lines[k + 1:]).strip("\n")
        if before:
            cell.source = before
            cells.append(cell)
            cell = nbformat.v4.new_markdown_cell()
        cell.source = SOLUTIONS
        cell.metadata["jp-MarkdownHeadingCollapsed"] = True
        cells.append(cell)
        if after:
            cells.append(nbformat.v4.new_markdown_cell(after))
    nb.cells = cells
    return nb


def solutions(*paths):
    """Apply ``mark_solutions`` to notebooks in place."""
    for path in paths:
        nb = nbformat.read(path, as_version=4)
        nbformat.write(mark_solutions(nb), path)


def source(nb_path, dst):
    nb = jupytext.read(nb_path)
    jupytext.write(nb, dst, fmt="py:percent")


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    {"build": build, "source": source, "sync": sync, "solutions": solutions}[cmd](*args)
