"""Write the package's import plumbing from what the chapter uses.

    python tools/api.py          # rewrite d2l_multi/__init__.py's imports and d2l_multi/_earlier/
    python tools/api.py --check  # exit 1 if either differs from what the notebooks need

The public API (``d2l_multi/__init__.py``) is: every name a notebook calls as ``d2l.NAME``
(in code or prose), every function or class a ``#@save`` cell defines, d2l's names the
chapter offers, and the package's errors that readers catch. Each is imported from the library
module that defines it; modules that import no heavy library (JAX, Flax, ...) at import time are
imported eagerly, the others lazily. ``d2l_multi/_earlier/M.py`` imports the names that the
``#@save`` code of module ``M`` calls as ``d2l.NAME``.
"""
import ast
import json
import pathlib
import re
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "d2l_multi"
D2L_COMPAT = {"FashionMNIST", "load_data_fashion_mnist", "Animator", "Timer", "Accumulator",
              "show_images", "set_axes", "use_svg_display", "try_gpu", "try_all_gpus",
              "num_gpus", "split_batch", "train"}
ERRORS = {"InputError", "DataError", "CheckpointError"}
EAGER = ("errors", "hardware", "utils", "plot", "data")  # import no heavy library
LIBRARY = [p for p in sorted(PACKAGE.glob("*.py")) if not p.name.startswith("__")
           and p.stem not in ("mp_train",) and not p.stem.startswith("_")]


def cells(kinds=("code",)):
    for nb in sorted((ROOT / "chapters").glob("*.ipynb")):
        for cell in json.loads(nb.read_text())["cells"]:
            if cell["cell_type"] in kinds:
                yield "".join(cell["source"])


def saved(constants=True):
    """The names the ``#@save`` cells define (only functions and classes unless
    ``constants``)."""
    names = set()
    for source in cells():
        if source.startswith("#@save"):
            for node in ast.parse(source).body:
                if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                    names.add(node.name)
                elif isinstance(node, ast.Assign) and constants:
                    for target in node.targets:
                        names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
    return names


def wanted():
    """The functions and classes the ``#@save`` cells define, the names the chapter calls as
    ``d2l.NAME``, d2l's names and the package's errors (a constant of a ``#@save`` cell only
    if the chapter calls it by its ``d2l.`` name)."""
    names = set(D2L_COMPAT | ERRORS) | saved(constants=False)
    for source in cells(("code", "markdown")):
        names |= set(re.findall(r"\bd2l\.([A-Za-z_]\w*)", source))
    return {n for n in names if not n.startswith("_")}


def homes():
    """{name: module} of the top-level definitions of the library's modules."""
    found = {}
    for path in LIBRARY:
        for node in ast.parse(path.read_text()).body:
            defined = []
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                defined = [node.name]
            elif isinstance(node, ast.Assign):
                defined = [n.id for t in node.targets for n in ast.walk(t)
                           if isinstance(n, ast.Name)]
            for name in defined:
                found.setdefault(name, path.stem)
    return found


def import_lines(by_module, indent):
    out = []
    for module, names in by_module:
        names = ", ".join(sorted(names, key=lambda s: (s.lower(), s)))
        line = f"{indent}from .{module} import {names}"
        if len(line) > 100:
            words, rows, row = names.split(" "), [], indent + "    "
            for word in words:
                if len(row) + len(word) + 1 > 96:
                    rows.append(row.rstrip())
                    row = indent + "    "
                row += word + " "
            rows.append(row.rstrip() + ",")
            line = f"{indent}from .{module} import (\n" + "\n".join(rows).rstrip(",") + \
                ",\n" + f"{indent})"
        out.append(line)
    return "\n".join(out)


def render():
    home = homes()
    names = wanted()
    missing = sorted(n for n in names if n not in home)
    if missing:
        sys.exit(f"no library module defines {missing}")
    order = [p.stem for p in LIBRARY]
    by = {}
    for name in names:
        by.setdefault(home[name], set()).add(name)
    eager = [(m, by[m]) for m in EAGER if m in by]
    lazy = [(m, by[m]) for m in order if m in by and m not in EAGER]
    return import_lines(eager, ""), import_lines(lazy, "    ")


EARLIER_DOC = '''"""What the ``#@save`` code of ``d2l_multi.{module}`` calls as ``d2l.NAME``:
functions of earlier notebooks, imported from where they are defined (written by tools/api.py)."""
'''


def earlier():
    """{path: text} of ``_earlier/M.py`` for each module M whose ``#@save`` code calls
    ``d2l.NAME``."""
    home, shown = homes(), saved()
    files = {}
    for path in LIBRARY:
        used = set()
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.name in shown:
                used |= {n.attr for n in ast.walk(node) if isinstance(n, ast.Attribute)
                         and isinstance(n.value, ast.Name) and n.value.id == "d2l"}
        if used:
            by = {}
            for name in used:
                by.setdefault(home[name], set()).add(name)
            lines = import_lines(sorted(by.items()), "").replace("from .", "from ..")
            listed = ", ".join(f'"{n}"' for n in sorted(used))
            files[PACKAGE / "_earlier" / path.name] = (
                EARLIER_DOC.format(module=path.stem) + lines + f"\n\n__all__ = [{listed}]\n")
    return files


def main():
    init = PACKAGE / "__init__.py"
    text = init.read_text()
    eager, lazy = render()
    start = text.index("from typing import TYPE_CHECKING\n") + len(
        "from typing import TYPE_CHECKING\n")
    end = text.index("\n__version__")
    new = {init: text[:start] + "\n" + eager + "\n\nif TYPE_CHECKING:\n" + lazy + "\n" +
           text[end:], **earlier()}
    stale = [p for p, t in new.items() if not p.exists() or p.read_text() != t]
    stale += [p for p in (PACKAGE / "_earlier").glob("*.py")
              if p.name != "__init__.py" and p not in new]
    if "--check" in sys.argv:
        sys.exit(f"not what the notebooks need: {[str(p.relative_to(ROOT)) for p in stale]}; "
                 f"run python tools/api.py" if stale else 0)
    for path in stale:
        if path in new:
            path.write_text(new[path])
        else:
            path.unlink()


if __name__ == "__main__":
    main()
