"""The package's shape: a small public API that IDEs can follow to the chapter's code, a
library that never imports the command-line programs or the exercise checks, no import
cycles, and no process-wide side effects at import."""
import ast
import pathlib
import subprocess
import sys

import pytest

import d2l_multi

PACKAGE = pathlib.Path(d2l_multi.__file__).resolve().parent
APART = ("commands", "exercises")  # the subpackages the library never imports
ALIASES = {"d2l_multi.__main__", "d2l_multi.mp_train"}  # entry points: `python -m ...`


def module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path):
    """The d2l_multi modules that ``path`` imports anywhere (top level, functions,
    ``TYPE_CHECKING`` blocks), as absolute module names."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.split(".")[0] == "d2l_multi"}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[:len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "d2l_multi":
                continue
            subs = {f"{module}.{a.name}" for a in node.names} & KNOWN
            found |= subs or {module}  # ``from package import submodule``: the submodule
    return {m for m in found if m in KNOWN} - {name}


KNOWN = {module_name(p) for p in PACKAGE.rglob("*.py")}
GRAPH = {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}


def is_library(module):
    return module not in ALIASES and not any(
        module == f"d2l_multi.{sub}" or module.startswith(f"d2l_multi.{sub}.") for sub in APART)


def test_the_public_api_is_small_and_holds_no_checks():
    names = d2l_multi.__all__
    assert len(names) <= 150, len(names)
    assert not [n for n in names if n.startswith(("check_", "_"))]
    assert len(set(names)) == len(names)
    for name in names:  # every public name resolves (the lazy ones are imported here)
        assert getattr(d2l_multi, name) is not None, name


def test_the_lazy_names_are_the_type_checking_imports():
    """IDEs read the ``if TYPE_CHECKING`` block; ``__getattr__`` imports from the same list."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If)
                 and ast.unparse(n.test) == "TYPE_CHECKING")
    listed = {a.name for node in block.body for a in node.names}
    assert listed == set(d2l_multi._LAZY) and listed <= set(d2l_multi.__all__)


def test_the_library_never_imports_the_commands_or_the_exercises():
    wrong = {(m, i) for m, found in GRAPH.items() if is_library(m)
             for i in found if not is_library(i) and i not in ALIASES}
    assert not wrong, sorted(wrong)


def test_no_module_imports_itself_round_about():
    """No cycle in the import graph (the package's ``__init__`` included)."""
    state, cycle = {}, []

    def visit(module, path):
        state[module] = "open"
        for other in sorted(GRAPH.get(module, ())):
            if state.get(other) == "open":
                cycle.append(path[path.index(other):] + [other])
            elif other not in state:
                visit(other, path + [other])
        state[module] = "done"
    for module in sorted(GRAPH):
        if module not in state:
            visit(module, [module])
    assert not cycle, cycle[:3]


# Lines of the library (d2l_multi/ without commands/ and exercises/): it grows only by a
# reviewed change. The aim is 4,500, an evening's reading; most of the difference is the
# argument checks, which only dropping checks would remove.
MAX_LIBRARY_LINES = 5775


def test_the_library_does_not_grow():
    lines = sum(len(p.read_text().splitlines()) for p in PACKAGE.rglob("*.py")
                if is_library(module_name(p)))
    assert lines <= MAX_LIBRARY_LINES, lines


@pytest.mark.parametrize("name", ["train", "split_batch", "FashionMNIST", "train_nnx",
                                  "save_checkpoint", "init_lenet_params", "Animator"])
def test_go_to_definition_lands_on_the_chapters_code(name, tmp_path):
    """What a student's IDE does with ``d2l.NAME`` (jedi: JupyterLab, VS Code's Jedi mode)."""
    jedi = pytest.importorskip("jedi")
    script = tmp_path / "notebook.py"
    script.write_text(f"import d2l_multi as d2l\nd2l.{name}\n")
    found = jedi.Script(path=str(script)).goto(2, 5, follow_imports=True)
    assert found, f"jedi finds no definition of d2l.{name}"
    path = pathlib.Path(found[0].module_path).resolve()
    assert path.is_relative_to(PACKAGE) and path.name != "__init__.py", path
    # the public name (the shown function behind its argument check), in the shown module
    assert found[0].full_name.endswith(f".{name}"), found[0]


def test_importing_any_module_changes_no_process_wide_hook():
    """Importing d2l_multi's modules leaves ``sys.unraisablehook``, the excepthook and the
    root and absl loggers as they were (a filter there would hide other programs' messages).
    The libraries it builds on are imported first: what they do at import is theirs."""
    modules = sorted(m for m in GRAPH if m not in ALIASES)
    code = f"""
import logging, sys, importlib
import jax, flax.nnx, optax, orbax.checkpoint, grain, matplotlib.pyplot
loggers = [logging.getLogger(), logging.getLogger("absl")]
def state():
    return (sys.unraisablehook, sys.excepthook,
            [(list(l.filters), list(l.handlers), l.level) for l in loggers])
before = state()
for name in {modules!r}:
    importlib.import_module(name)
assert state() == before, (before, state())
print("unchanged")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=600)
    assert out.stdout.strip() == "unchanged", out.stderr[-2000:]


def test_the_import_lists_are_what_the_notebooks_need():
    """``d2l_multi/__init__.py``'s imports and ``d2l_multi/_earlier/`` follow from the
    notebooks (``python tools/api.py`` writes them): a new ``#@save`` function is public, and
    every ``d2l.NAME`` the ``#@save`` code calls resolves."""
    root = PACKAGE.parent
    out = subprocess.run([sys.executable, str(root / "tools" / "api.py"), "--check"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def _public_callables():
    for name in d2l_multi.__all__:
        obj = getattr(d2l_multi, name)
        if callable(obj) and not (isinstance(obj, type) and issubclass(obj, BaseException)):
            yield name, obj


def test_every_public_function_and_class_is_typed():
    """Each parameter of what the package exports has a type; a shown (``#@save``) function
    takes the types of its check (``validated``), which ``inspect.signature`` shows."""
    import inspect
    untyped = {name: [p.name for p in inspect.signature(obj).parameters.values()
                      if p.annotation is p.empty]
               for name, obj in _public_callables()}
    assert not {k: v for k, v in untyped.items() if v}, untyped


def test_every_check_takes_the_parameters_of_its_function():
    """A check's parameters are those of the shown function: names, kinds and defaults."""
    import inspect

    def shape(signature):
        return [(p.name, p.kind, p.default) for p in signature.parameters.values()]
    for name, obj in _public_callables():
        shown = getattr(obj, "__wrapped__", None)
        if shown is None or not hasattr(obj, "__signature__"):
            continue  # not behind a check
        while hasattr(shown, "__wrapped__") and not isinstance(shown, type):
            shown = shown.__wrapped__
        target = shown.__init__ if isinstance(shown, type) else shown
        expected = shape(inspect.signature(target))
        if isinstance(shown, type):
            expected = expected[1:]  # self
        assert shape(inspect.signature(obj)) == expected, name
