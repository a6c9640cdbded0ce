"""Pipeline parallelism: the pipelined step (GPipe and 1F1B, several stages and micro-batch
counts) computes one device's loss and gradients; the idle fraction counted from the executed
schedule is the bubble formula; GPipe holds m micro-batches per stage and 1F1B at most p, in
the count and in the compiled program's temporary bytes; bad input gets one clear line."""
import inspect

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import d2l_multi as d2l
from d2l_multi.pipeline_parallel import IDLE, KIND, _check_table

BLOCKS, WIDTH, HIDDEN, BATCH = 8, 8, 16, 16
ORDERS = {"gpipe": d2l.gpipe_order, "1f1b": d2l.one_f_one_b_order}
TOL = 1e-6  # float32 rounding: the pipeline sums over micro-batches in another order


def stage_mesh(p):
    return jax.make_mesh((p,), ("stage",), devices=jax.devices()[:p])


def kinds_of(table):
    return np.array([[KIND[op and op[0]] for op in row] for row in table])


@pytest.fixture(scope="module")
def problem():
    params = d2l.init_residual_mlp(jax.random.key(0), BLOCKS, WIDTH, HIDDEN)
    X = jax.random.normal(jax.random.key(1), (BATCH, WIDTH))
    Y = jnp.sin(X @ jax.random.normal(jax.random.key(2), (WIDTH, WIDTH)))
    loss, grads = jax.value_and_grad(
        lambda w, X, Y: d2l.mse(d2l.residual_mlp(w, X), Y))(params, X, Y)
    return params, X, Y, loss, grads


@pytest.fixture(scope="module")
def runs(problem):
    """One pipelined step per (order, p, m), computed once and shared by the tests."""
    params, X, Y, _, _ = problem
    cache = {}

    def run(order, p, m):
        if (order, p, m) not in cache:
            mesh = stage_mesh(p)
            table = d2l.pipeline_schedule(ORDERS[order](p, m))
            stages = jax.device_put(params, NamedSharding(mesh, P("stage")))
            loss, grads, ran = d2l.pipeline_step(stages, X, Y, mesh, table)
            cache[order, p, m] = table, float(loss), grads, np.asarray(ran)
        return cache[order, p, m]
    return run


CASES = [(order, p, m) for order in ORDERS for p in (2, 4) for m in (4, 8)]


@pytest.mark.parametrize("order,p,m", CASES)
def test_pipelined_step_equals_one_device(problem, runs, order, p, m):
    _, _, _, loss, grads = problem
    _, pipelined_loss, pipelined_grads, _ = runs(order, p, m)
    assert abs(pipelined_loss - float(loss)) < TOL
    assert d2l.max_difference(pipelined_grads, grads) < TOL
    assert pipelined_grads["W1"].sharding.spec[0] == "stage"  # each stage kept its own


@pytest.mark.parametrize("order,p,m", CASES)
def test_idle_fraction_counted_from_the_run_is_the_bubble(runs, order, p, m):
    table, _, _, ran = runs(order, p, m)
    assert ran.shape == (2 * (m + p - 1), p)
    np.testing.assert_array_equal(ran, kinds_of(table))  # it ran the table, slot by slot
    idle_slots = (ran == IDLE).sum(axis=0)
    assert (idle_slots == 2 * (p - 1)).all()              # of 2(m + p - 1) slots
    assert np.allclose((ran == IDLE).mean(axis=0), d2l.bubble_fraction(p, m),
                       rtol=0, atol=1e-12)


@pytest.mark.parametrize("p,m", [(2, 4), (2, 8), (4, 4), (4, 8)])
def test_gpipe_holds_m_micro_batches_and_1f1b_at_most_p(runs, p, m):
    held = d2l.in_flight(runs("gpipe", p, m)[3]).max(axis=0)
    assert (held == m).all()
    held = d2l.in_flight(runs("1f1b", p, m)[3]).max(axis=0)
    assert held.max() <= p and held[0] == min(p, m)


def test_1f1b_stash_is_smaller_in_the_compiled_program(problem):
    params, X, Y, _, _ = problem
    p, m = 4, 8
    mesh = stage_mesh(p)
    stages = jax.device_put(params, NamedSharding(mesh, P("stage")))
    step = jax.jit(inspect.unwrap(d2l.pipeline_step), static_argnames=("mesh", "table"))
    temp = {order: step.lower(stages, X, Y, mesh, d2l.pipeline_schedule(ORDERS[order](p, m)))
            .compile().memory_analysis().temp_size_in_bytes for order in ORDERS}
    expected = (m - p) * (BATCH // m) * WIDTH * 4  # the stash: m inputs vs p
    assert abs(temp["gpipe"] - temp["1f1b"] - expected) <= 0.1 * expected, temp


def test_stage_program_on_a_data_by_stage_mesh(problem):
    params, X, Y, loss, grads = problem
    mesh = jax.make_mesh((2, 4), ("data", "stage"))
    table = d2l.pipeline_schedule(d2l.one_f_one_b_order(4, 4))

    def program(w, X, Y):
        out = d2l.stage_program(w, X, Y, table, d2l.residual_mlp, d2l.mse)
        return lax.pmean(out[:2], "data")
    step = jax.jit(jax.shard_map(program, mesh=mesh, in_specs=(P("stage"), P("data"), P("data")),
                                 out_specs=(P(), P("stage")), check_vma=False))
    got_loss, got_grads = step(jax.device_put(params, NamedSharding(mesh, P("stage"))),
                               *jax.device_put((X, Y), NamedSharding(mesh, P("data"))))
    assert abs(float(got_loss) - float(loss)) < TOL
    assert d2l.max_difference(got_grads, grads) < TOL


# --- the schedules, without running them ------------------------------------------------------

def reference_1f1b(p, m):
    """1F1B as usually written: warm-up forwards, steady one-forward-one-backward, cool-down."""
    orders = []
    for s in range(p):
        warm = min(p - 1 - s, m)
        order = [("F", j) for j in range(warm)]
        for j in range(m - warm):
            order += [("F", warm + j), ("B", j)]
        orders.append(order + [("B", j) for j in range(m - warm, m)])
    return orders


@pytest.mark.parametrize("p", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("m", [1, 2, 3, 4, 8, 16])
def test_schedules_take_2_m_plus_p_minus_1_slots_with_the_bubble(p, m):
    assert d2l.one_f_one_b_order(p, m) == reference_1f1b(p, m)
    for order in ORDERS.values():
        table = d2l.pipeline_schedule(order(p, m))
        _check_table(table)                       # every pass after the one it needs
        kinds = kinds_of(table)
        assert len(table) == 2 * (m + p - 1)
        assert np.allclose((kinds == IDLE).mean(axis=0), d2l.bubble_fraction(p, m))
    assert (d2l.in_flight(kinds_of(d2l.pipeline_schedule(d2l.gpipe_order(p, m)))).max(0)
            == m).all()
    assert d2l.in_flight(kinds).max() <= p           # 1F1B, the last order


def test_constants_in_the_notebook_equal_the_library():
    import ast
    import json
    import pathlib
    nb = pathlib.Path(__file__).resolve().parent.parent / "chapters/09d_pipeline_parallelism.ipynb"
    names = {}
    for cell in json.loads(nb.read_text())["cells"]:
        src = "".join(cell["source"])
        if cell["cell_type"] == "code" and src.startswith("#@save"):
            assigns = [node for node in ast.parse(src).body if isinstance(node, ast.Assign)]
            exec(compile(ast.Module(assigns, []), nb.name, "exec"), names)
    names.pop("__builtins__")
    from d2l_multi import pipeline_parallel
    assert names == {name: getattr(pipeline_parallel, name)
                     for name in ("IDLE", "FORWARD", "BACKWARD", "KIND")}


def test_bubble_fraction():
    assert d2l.bubble_fraction(1, 10) == 0
    assert d2l.bubble_fraction(4, 1) == 0.75  # one micro-batch: one stage busy at a time
    assert d2l.bubble_fraction(4, 8) == pytest.approx(3 / 11)
    assert d2l.bubble_fraction(8, 63) == pytest.approx(0.1)


# --- bad input: one line naming the value and the fix -------------------------------------------

def one_line(excinfo):
    message = str(excinfo.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize("call,match", [
    (lambda: d2l.bubble_fraction(4, 0), "num_micro must be a positive integer"),
    (lambda: d2l.gpipe_order(0, 4), "num_stages must be a positive integer"),
    (lambda: d2l.one_f_one_b_order(2, 1.5), "num_micro must be a positive integer"),
    (lambda: d2l.pipeline_schedule([[("F", 0), ("B", 0)], [("B", 0), ("F", 0)]]),
     "stage 1 runs the backward of micro-batch 0 before its forward"),
    (lambda: d2l.pipeline_schedule([[("F", 0), ("F", 0), ("B", 0)], [("F", 0), ("B", 0)]]),
     r"stage 0 runs the forwards of micro-batches \[0, 0\]"),
    (lambda: d2l.pipeline_schedule([[("F", 1), ("F", 0), ("B", 0), ("B", 1)]]),
     "in this order"),
    (lambda: d2l.pipeline_schedule([[("F", 0), ("B", 0), ("F", 1), ("B", 1)],
                                    [("F", 0), ("F", 1), ("B", 0), ("B", 1)]]),
     "wait forever"),
    (lambda: d2l.pipeline_schedule([[("X", 0), ("B", 0)]]), r"pass 0 of stage 0 is \('X', 0\)"),
    (lambda: d2l.pipeline_schedule("FB"), "one list of passes per stage"),
    (lambda: d2l.in_flight(np.array([[0, 3]])), "kinds must be a 2-D array"),
    (lambda: d2l.show_schedule([[("F", 0)]]), "make it with pipeline_schedule"),
])
def test_bad_schedules(call, match):
    with pytest.raises(ValueError, match=match) as e:
        call()
    one_line(e)


@pytest.fixture(scope="module")
def placed(problem):
    params, X, Y, _, _ = problem
    mesh = stage_mesh(4)
    return jax.device_put(params, NamedSharding(mesh, P("stage"))), X, Y, mesh


def test_batch_that_does_not_split_into_micro_batches(placed):
    stages, X, Y, mesh = placed
    table = d2l.pipeline_schedule(d2l.gpipe_order(4, 3))
    with pytest.raises(ValueError, match=r"batch size 16 does not divide evenly over 3 "
                                         "micro-batches; use a multiple of 3, e.g. 15 or 18") as e:
        d2l.pipeline_step(stages, X, Y, mesh, table)
    one_line(e)


@pytest.mark.parametrize("change,match", [
    (lambda s, X, Y, mesh, t: (s, X, Y, stage_mesh(2), t),
     "the table has 4 stages but the mesh's 'stage' axis has 2 devices"),
    (lambda s, X, Y, mesh, t: (s, X, Y, jax.make_mesh((4,), ("data",),
                                                      devices=jax.devices()[:4]), t),
     r"needs a 1-D mesh with axis 'stage', e.g. jax.make_mesh\(\(4,\), \('stage',\)\)"),
    (lambda s, X, Y, mesh, t: (jax.tree.map(lambda a: np.asarray(a)[:6], s), X, Y, mesh, t),
     r"hold \[6\] blocks, which do not split into 4 stages"),
    (lambda s, X, Y, mesh, t: (jax.tree.map(np.asarray, s), X, Y, mesh, t),
     r"place them with jax.device_put\(params, NamedSharding\(mesh, P\('stage'\)\)\)"),
    (lambda s, X, Y, mesh, t: (s, X, Y[:8], mesh, t), "X has 16 examples but Y has 8 labels"),
    (lambda s, X, Y, mesh, t: (s, X, Y, mesh, [list(row) for row in t]),
     "table must be a non-empty tuple of time slots"),
    (lambda s, X, Y, mesh, t: (s, X, Y, mesh, t[:-1] + ((None, None, None, None),) + t[-1:]),
     "runs B3 on stage 0, not in the slot after B3 on stage 1"),
])
def test_bad_pipeline_step_arguments(placed, change, match):
    table = d2l.pipeline_schedule(d2l.gpipe_order(4, 4))
    with pytest.raises(ValueError, match=match) as e:
        d2l.pipeline_step(*change(*placed, table))
    one_line(e)


def test_the_check_keeps_a_delayed_gradient_from_giving_wrong_gradients(problem, placed):
    """Without the check, a backward pass that runs a slot late would read the zeros that
    overwrote its gradient: the check is what keeps the result right."""
    _, _, _, _, grads = problem
    stages, X, Y, mesh = placed
    table = d2l.pipeline_schedule(d2l.gpipe_order(4, 4))
    late = table[:-1] + ((None,) * 4,) + table[-1:]
    step = jax.jit(inspect.unwrap(d2l.pipeline_step), static_argnames=("mesh", "table"))
    _, wrong, _ = step(stages, X, Y, mesh, late)
    assert d2l.max_difference(wrong, grads) > 1e-3
