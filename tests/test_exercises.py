"""The self-checking exercises (d2l_multi/exercises/): every reference solution passes its
check, public and hidden cases; every plausible wrong answer fails with the hint meant for it;
a starter fails with one line, never a traceback; and every main-line notebook has a check."""
import ast
import inspect
import json
import pathlib
import re
import subprocess
import sys

import exercise_answers as answers
import pytest

from d2l_multi import exercises
from d2l_multi.commands import grading
from d2l_multi.exercises import _common

ROOT = pathlib.Path(__file__).resolve().parent.parent
MAIN_LINE = ["00_devices", "01_lenet_from_scratch", "02_allreduce",
             "03_data_parallel_from_scratch", "04a_jit_and_shardings", "04b_shard_map",
             "05a_flax", "05b_batchnorm", "05c_resnet", "06_keras", "07a_collectives",
             "07b_predicting_steps", "07c_mixed_precision",
             "07d_low_precision_communication", "08_ensembles",
             "09a_memory", "09b_remat", "09c_meshes_and_rules",
             "09d_fsdp_and_tensor_parallelism", "09e_pipeline_parallelism",
             "09f_overlapping_communication", "10a_checkpoints", "10b_input_pipelines",
             "11a_multi_process", "11b_failures",
             "12_capstone"]
WRONG = [(name, i) for name, cases in answers.WRONG.items() for i in range(len(cases))]
ALSO_RIGHT = [(name, i) for name, given in answers.ALSO_RIGHT.items()
              for i in range(len(given))]


def check(name):
    """The check called ``name`` ('allreduce.broadcast')."""
    return exercises.check(*name.split("."))


def test_every_main_line_notebook_has_checks_and_every_check_an_answer():
    names = {f"{m}.{c}" for m, checks in exercises.CHECKS.items() for c in checks}
    assert len(names) >= 25
    assert set(exercises.CHECKS) == {exercises.module_of(nb) for nb in MAIN_LINE}
    assert set(answers.REFERENCE) == names == set(answers.WRONG)


def hidden(name):
    """The grader's hidden cases of the check ``name`` (classroom/grader/, not packaged)."""
    module, check_name = name.split(".")
    return grading.hidden_cases(ROOT / "classroom", module).get(check_name, [])


@pytest.mark.parametrize("name", sorted(answers.REFERENCE))
def test_the_reference_solution_passes(name, capsys):
    """The public cases live; the hidden ones as the grader runs them: recorded with the
    student's code, then judged apart from it."""
    check(name)(*answers.REFERENCE[name])
    out = capsys.readouterr().out
    assert out.startswith(f"PASS {name.split('.')[1]}: ") and out.count("\n") == 1
    assert not re.search(r"[=*/] *\(|\*\*", out), out  # a PASS line prints no formula
    recorded = _common._record(check(name), answers.REFERENCE[name], hidden(name))
    ok, line = _common._replay(check(name), recorded, hidden(name))
    assert ok, line


@pytest.mark.parametrize("name,i", ALSO_RIGHT, ids=[f"{n}-{i}" for n, i in ALSO_RIGHT])
def test_another_right_answer_passes(name, i):
    """A right design other than the reference's passes too, public and hidden cases."""
    given = answers.ALSO_RIGHT[name][i]
    check(name)(*given)
    recorded = _common._record(check(name), given, hidden(name))
    ok, line = _common._replay(check(name), recorded, hidden(name))
    assert ok, line


def test_an_answer_cannot_change_what_the_grader_compares_it_with(monkeypatch):
    """The one-device steps a sharded run must equal are computed where the check judges
    (when grading, the grader's process): an answer that replaces them in its own process
    with its own results still fails its hidden case."""
    import numpy as np
    import optax

    from d2l_multi.exercises import capstone
    name, out = "capstone.sharded_training", {}

    def train(*args):  # Adam replaced by SGD (a wrong answer) ...
        out["run"] = answers.capstone_train(*args, optimizer=optax.sgd(1e-3))
        return out["run"]

    def own_results(*args):  # ... and the reference by its own results
        losses, params, _ = out["run"]
        return [float(x) for x in losses], {
            k: np.asarray(v) for k, v in capstone._flat(params).items()}
    with monkeypatch.context() as m:
        m.setattr(capstone, "_one_device_losses", own_results)
        recorded = _common._record(check(name), (train, answers.uses_all_gather),
                                   hidden(name))
    ok, line = _common._replay(check(name), recorded, hidden(name))
    assert not ok and "later ones differ" in line, line


@pytest.mark.parametrize("module", sorted(exercises.CHECKS))
def test_a_check_module_loads_as_the_grader_loads_it(module):
    """The grader's test cell loads a check module and ``_common`` alone, as modules of a
    package of its own (grading.load_check_sources, the code RUNNER runs): a check imports the
    library by its absolute name and no sibling module but ``_common``, or it fails only
    when graded."""
    source = (ROOT / "d2l_multi" / "exercises" / f"{module}.py").read_text()
    relative = sorted({node.module or "." for node in ast.walk(ast.parse(source))
                       if isinstance(node, ast.ImportFrom) and node.level
                       and not (node.level == 1 and node.module == "_common")})
    assert not relative, f"{module}.py imports {relative} relatively"
    folder = ROOT / "d2l_multi" / "exercises"
    try:
        sources = {name: (folder / f"{name}.py").read_text() for name in ("_common", module)}
        loaded = grading.load_check_sources(sources, "_d2l_grader_test")
    finally:
        grading.unload_checks("_d2l_grader_test")
    assert set(exercises.CHECKS[module]) <= set(vars(loaded[module]))


def test_every_check_has_hidden_cases_and_no_public_way_to_them():
    for name in answers.REFERENCE:
        module, check_name = name.split(".")
        assert check_name in grading.hidden_cases(ROOT / "classroom", module), name
        assert "hidden" not in inspect.signature(check(name)).parameters


@pytest.mark.parametrize("name,i", WRONG, ids=[f"{n}-{i}" for n, i in WRONG])
def test_a_wrong_answer_fails_with_its_hint(name, i):
    wrong, hint = answers.WRONG[name][i]
    with pytest.raises(exercises.CheckFailed) as failed:
        check(name)(*wrong)
    message = str(failed.value)
    assert message.startswith(f"FAIL {name.split('.')[1]}: ")
    assert hint in message, message
    assert "\n" not in message and failed.value._render_traceback_() == [message]


@pytest.mark.parametrize("name", sorted(answers.REFERENCE))
def test_a_starter_fails_with_one_line(name):
    """The student edition's starters: a function whose body is ``...`` (returns None), one
    that raises NotImplementedError, a value left as ``...``."""
    for starter in (answers.starter_function, answers.starter_raises):
        given = tuple(starter if callable(a) else answers.STARTER_VALUE
                      for a in answers.REFERENCE[name])
        with pytest.raises(exercises.CheckFailed) as failed:
            check(name)(*given)
        message = str(failed.value)
        assert "\n" not in message and re.search(
            r"returned None|not written yet|is still `\.\.\.`", message), message


def test_a_check_reports_an_exception_of_the_students_code_in_one_line():
    def broken(costs, p):
        return p / 0
    with pytest.raises(exercises.CheckFailed,
                       match=r"`broken` raised ZeroDivisionError: division by zero$"):
        check("pipeline_parallelism.balanced_stages")(broken)


def test_a_ring_check_names_the_students_function_as_they_named_it():
    def ring_sum(x, axis_name):
        from jax import lax
        return lax.psum(x, axis_name)
    with pytest.raises(exercises.CheckFailed, match=r"`ring_sum` uses psum: write it with "
                                              r"lax\.ppermute alone"):
        check("allreduce.ring_allreduce")(ring_sum)


def test_importing_the_checks_starts_no_backend():
    code = ("import sys\nfrom d2l_multi import exercises\nexercises.CHECKS\n"
            "from jax._src import xla_bridge\n"
            "print(xla_bridge.backends_are_initialized(), 'flax' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True).stdout
    assert out.split() == ["False", "False"]


def test_the_teachers_guide_lists_every_check_with_its_notebook():
    guide = (ROOT / "docs" / "classroom.md").read_text()
    for module, names in exercises.CHECKS.items():
        notebook = next(nb for nb in MAIN_LINE if exercises.module_of(nb) == module)
        for name in names:
            assert re.search(rf"^\| `?{notebook}`? .*`{name}`", guide, re.M), (name, notebook)


@pytest.mark.parametrize("module", sorted(exercises.CHECKS))
def test_every_check_is_called_in_its_notebooks_solutions(module):
    """A check no notebook calls is a check no student meets: its notebook's Solutions import
    the checks as ``check`` and call each in a cell of its own, as the classroom tools
    expect."""
    notebook = next(p for p in ROOT.glob("chapters/*.ipynb")
                    if exercises.module_of(p.stem) == module)
    cells = json.loads(notebook.read_text())["cells"]
    start = next(i for i, c in enumerate(cells)
                 if c["cell_type"] == "markdown" and "## Solutions" in "".join(c["source"]))
    code = ["".join(c["source"]) for c in cells[start:] if c["cell_type"] == "code"]
    assert any(f"from d2l_multi.exercises import {module} as check" in c for c in code)
    for name in exercises.CHECKS[module]:
        assert any(f"check.{name}(" in c for c in code), f"{notebook.name} never calls {name}"
