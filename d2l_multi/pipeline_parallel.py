"""Pipeline parallelism that runs: residual blocks cut into stages over a 'stage' mesh
axis, a schedule (GPipe or 1F1B) as a table of time slots x stages, and one ``shard_map``
program that executes the table, passing activations forward and gradients back between
neighbouring stages with ``lax.ppermute``."""
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P
from jax.typing import ArrayLike

from . import _checks as check
from .errors import InputError


def bubble_fraction(num_stages, num_micro):
    """The idle fraction of a pipeline's stages, for equal passes."""
    return (num_stages - 1) / (num_micro + num_stages - 1)


def init_residual_mlp(key: jax.Array, num_blocks: int, width: int,
                      hidden: int) -> dict[str, jax.Array]:
    """Parameters of ``num_blocks`` residual blocks, stacked along a leading axis."""
    check.integer(1, num_blocks=num_blocks, width=width, hidden=hidden)
    check.fits(4 * num_blocks * (2 * width * hidden + hidden), f"{num_blocks} blocks of "
               f"width {width} and {hidden} hidden units", "pass smaller sizes")
    k1, k2 = jax.random.split(key)
    return {"W1": jax.random.normal(k1, (num_blocks, width, hidden)) / width**0.5,
            "b1": jnp.zeros((num_blocks, hidden)),
            "W2": jax.random.normal(k2, (num_blocks, hidden, width)) / hidden}


def residual_mlp(params, X):
    """Apply the blocks X + relu(X W1 + b1) W2 stacked in ``params``."""
    def block(X, w):
        return X + jax.nn.relu(X @ w['W1'] + w['b1']) @ w['W2'], None
    return lax.scan(block, X, params)[0]


def mse(Y_hat, Y):
    return jnp.mean((Y_hat - Y) ** 2)


def gpipe_order(num_stages, num_micro):
    """Each stage's passes in GPipe order: all forwards, then all backwards."""
    passes = [(kind, j) for kind in 'FB' for j in range(num_micro)]
    return [passes] * num_stages


def one_f_one_b_order(num_stages, num_micro):
    """GPipe's passes reordered: on stage s, the backward of j right after the
    forward of j + p - 1 - s, or as soon as the forwards are all done."""
    orders = []
    for s, passes in enumerate(gpipe_order(num_stages, num_micro)):
        delay = num_stages - s - 0.5        # sorts B_j after F_(j+p-1-s)
        key = lambda op: op[1] + delay * (op[0] == 'B')
        orders.append(sorted(passes, key=key))
    return orders


def pipeline_schedule(orders):
    """The table (slot x stage: ('F', j), ('B', j) or None) that runs each
    stage's passes in order, each in the first slot after the pass it needs."""
    p, done, table = len(orders), {}, []
    todo = [list(passes) for passes in orders]
    while any(todo):
        t, row = len(table), []
        for s, passes in enumerate(todo):
            kind, j = passes[0] if passes else (None, None)
            need = (s - 1, 'F', j) if kind == 'F' else (s + 1, 'B', j)
            if kind == 'B' and s == p - 1:
                need = (s, 'F', j)               # the loss's backward
            ready = need[0] < 0 or done.get(need, t + 1) <= t
            row.append(passes.pop(0) if passes and ready else None)
            if row[-1]:
                done[(s, kind, j)] = t + 1       # its result arrives next slot
        table.append(tuple(row))
    return tuple(table)


def show_schedule(table):
    """Print a table one stage a line: F3 is the forward of micro-batch 3, . is idle."""
    for s in range(len(table[0])):
        ops = [f"{row[s][0]}{row[s][1]}" if row[s] else "." for row in table]
        print(f"stage {s}: " + " ".join(f"{op:3}" for op in ops).rstrip())


IDLE, FORWARD, BACKWARD = 0, 1, 2
KIND = {None: IDLE, 'F': FORWARD, 'B': BACKWARD}


def in_flight(kinds):
    """Micro-batches held by each stage (column) in each slot (row): arrived
    (stage 0: run forward) and not yet run backward."""
    F, B = (np.cumsum(kinds == kind, axis=0) for kind in (FORWARD, BACKWARD))
    arrived = np.pad(F[:-1, :-1], ((1, 0), (1, 0)))  # a slot after stage s-1
    arrived[:, 0] = F[:, 0]
    return arrived - np.pad(B[:-1], ((1, 0), (0, 0)))


def stage_pass(kind, params, x, dy, Y_j, last, stage_fn, loss_fn):
    """Idle, forward or backward (``kind``) of a stage on input ``x``: the
    activation to send on, the gradient to send back, the parameters'
    gradients and, on the ``last`` stage, the loss (zeros where none)."""
    zero_grads = jax.tree.map(jnp.zeros_like, params)

    def idle():
        return jnp.zeros_like(x), jnp.zeros_like(x), zero_grads, jnp.float32(0)

    def forward():
        y = stage_fn(params, x)
        loss = jnp.where(last, loss_fn(y, Y_j), 0.0)
        return y, jnp.zeros_like(x), zero_grads, loss

    def backward():            # recomputes the forward from x, as GPipe does
        y, vjp = jax.vjp(stage_fn, params, x)
        dw, dx = vjp(jnp.where(last, jax.grad(loss_fn)(y, Y_j), dy))
        return jnp.zeros_like(y), dx, dw, jnp.float32(0)

    return lax.switch(kind, [idle, forward, backward])


def stage_program(params, X, Y, table, stage_fn, loss_fn):
    """One stage's column of ``table``, slot by slot, in shard_map over 'stage':
    returns the loss, the stage's gradients and the kind of each slot's pass."""
    p, m = len(table[0]), 1 + max(op[1] for row in table for op in row if op)
    ops = np.array([[(KIND[op and op[0]], op[1] if op else 0) for op in row]
                    for row in table])              # (slots, stages, 2)
    cap = in_flight(ops[..., 0]).max()              # inputs held at once
    s = lax.axis_index('stage')
    X, Y = X.reshape(m, -1, *X.shape[1:]), Y.reshape(m, -1, *Y.shape[1:])

    def slot(carry, row):                           # row: (kind, j) per stage
        stash, dy, grads, loss = carry
        (kind, j), (before, i) = row[s], row[s - 1]
        x = jnp.where(s == 0, X[j], stash[j % cap])
        y, dx, dw, l = stage_pass(kind, params, x, dy, Y[j], s == p - 1,
                                  stage_fn, loss_fn)
        y = lax.ppermute(y, 'stage', [(a, a + 1) for a in range(p - 1)])
        dy = lax.ppermute(dx, 'stage', [(a + 1, a) for a in range(p - 1)])
        arrived = (s > 0) & (before == FORWARD)
        stash = stash.at[i % cap].set(jnp.where(arrived, y, stash[i % cap]))
        return (stash, dy, jax.tree.map(jnp.add, grads, dw), loss + l), kind

    stash = jnp.zeros((cap, *X.shape[1:]), X.dtype)
    init = (stash, stash[0], jax.tree.map(jnp.zeros_like, params), 0.0)
    (_, _, grads, loss), ran = lax.scan(slot, init, ops)
    grads = jax.tree.map(lambda g: g / m, grads)
    return lax.psum(loss, 'stage') / m, grads, ran[:, None]


@jax.jit(static_argnames=('mesh', 'table'))
def pipeline_step(params, X, Y, mesh, table):
    """Loss, gradients and the passes each stage ran, of one pipelined step."""
    program = lambda w, X, Y: stage_program(w, X, Y, table, residual_mlp, mse)
    return jax.shard_map(program, mesh=mesh, in_specs=(P('stage'), P(), P()),
                         out_specs=(P(), P('stage'), P(None, 'stage')),
                         check_vma=False)(params, X, Y)


# --- argument checks: the functions above, as the chapter shows them, behind a check


def _check_pass(op, where):
    ok = (isinstance(op, tuple) and len(op) == 2 and op[0] in ("F", "B")
          and isinstance(op[1], (int, np.integer)) and not isinstance(op[1], bool)
          and op[1] >= 0)
    if not ok:
        raise InputError(f"{where} is {op!r}; a pass is ('F', j) or ('B', j) for a "
                         f"micro-batch j >= 0")


def _check_passes(columns):
    """Each stage runs the forward and the backward of every micro-batch once, each kind in
    increasing micro-batch order (a stage reuses the buffer of micro-batch j - capacity)."""
    if not columns:
        raise InputError("a pipeline needs at least one stage")
    m = 1 + max((op[1] for passes in columns for op in passes), default=-1)
    for s, passes in enumerate(columns):
        for kind, name in (("F", "forwards"), ("B", "backwards")):
            js = [j for k, j in passes if k == kind]
            if js != list(range(m)):
                raise InputError(f"stage {s} runs the {name} of micro-batches {js}; each "
                                 f"stage runs those of 0, ..., {m - 1} once, in this order")
        order = {op: i for i, op in enumerate(passes)}
        late = [j for j in range(m) if order[("B", j)] < order[("F", j)]]
        if late:
            raise InputError(f"stage {s} runs the backward of micro-batch {late[0]} before "
                             f"its forward; put ('F', {late[0]}) first")


def _needs(s, kind, j, num_stages):
    if kind == "F":
        return None if s == 0 else (s - 1, "F", j)
    return (s, "F", j) if s == num_stages - 1 else (s + 1, "B", j)


Pass = tuple[str, int]  # ('F', j) or ('B', j): the forward or backward of micro-batch j
Table = tuple[tuple[Pass | None, ...], ...]  # slot x stage


def _check_orders(orders: Sequence[Sequence[Pass]]) -> None:
    """Raise a ValueError unless ``orders`` (one list of passes per stage) can run: every
    pass once, in increasing micro-batch order, and no stage waiting forever."""
    if not isinstance(orders, (list, tuple)) or not all(
            isinstance(passes, (list, tuple)) for passes in orders):
        raise InputError(f"orders must be one list of passes per stage, got {orders!r}")
    if not any(orders):
        raise InputError(f"orders {orders!r} hold no pass; give each stage its passes, e.g. "
                         f"[[('F', 0), ('B', 0)]]")
    for s, passes in enumerate(orders):
        for i, op in enumerate(passes):
            _check_pass(op, f"pass {i} of stage {s}")
    _check_passes(orders)
    p, position = len(orders), [0] * len(orders)
    done = set()
    while any(position[s] < len(orders[s]) for s in range(p)):  # run what can run
        progress = False
        for s in range(p):
            while position[s] < len(orders[s]):
                kind, j = orders[s][position[s]]
                if _needs(s, kind, j, p) not in done | {None}:
                    break
                done.add((s, kind, j))
                position[s] += 1
                progress = True
        if not progress:
            stuck = {s: orders[s][position[s]] for s in range(p)
                     if position[s] < len(orders[s])}
            raise InputError(f"these orders wait forever: the next passes {stuck} (stage: "
                             f"pass) each wait for another; reorder them")


def _check_table(table: Table) -> None:
    """Raise a ValueError unless ``table`` is a schedule a pipelined step can execute: a tuple
    of slots, each a tuple with one pass or None per stage, every pass once and after the
    pass it needs (as ``pipeline_schedule`` makes)."""
    if (not isinstance(table, tuple) or not table
            or not all(isinstance(row, tuple) for row in table)):
        raise InputError("table must be a non-empty tuple of time slots, each a tuple of one "
                         "entry per stage; make it with pipeline_schedule(orders)")
    p = len(table[0])
    if p == 0 or any(len(row) != p for row in table):
        raise InputError(f"the slots of table have {sorted({len(row) for row in table})} "
                         f"entries; every slot needs one entry per stage")
    when = {}
    for t, row in enumerate(table):
        for s, op in enumerate(row):
            if op is not None:
                _check_pass(op, f"slot {t}, stage {s}")
                when[(s, *op)] = t
    _check_passes([[op for row in table if (op := row[s]) is not None] for s in range(p)])
    for (s, kind, j), t in sorted(when.items(), key=lambda item: item[1]):
        need = _needs(s, kind, j, p)
        if need is not None and when[need] >= t:
            raise InputError(f"slot {t} runs {kind}{j} on stage {s} before {need[1]}{need[2]} "
                             f"on stage {need[0]} has finished; make the table with "
                             f"pipeline_schedule(orders)")
        if kind == "B" and s < p - 1 and when[need] != t - 1:
            raise InputError(f"slot {t} runs B{j} on stage {s}, not in the slot after B{j} on "
                             f"stage {s + 1} (slot {when[need]}); a stage keeps no gradient "
                             f"waiting, so run each backward as soon as its gradient arrives")


def _check_kinds(kinds: ArrayLike) -> None:
    kinds = np.asarray(kinds)
    if kinds.ndim != 2 or not np.isin(kinds, (IDLE, FORWARD, BACKWARD)).all():
        raise InputError(f"kinds must be a 2-D array (slots x stages) of {IDLE} (idle), "
                         f"{FORWARD} (forward) and {BACKWARD} (backward), got shape "
                         f"{kinds.shape} with values {np.unique(kinds)[:5].tolist()}")


def _check_pipeline_step(params: Any, X: ArrayLike, Y: ArrayLike, mesh: Mesh,
                         table: Table) -> None:
    _check_table(table)
    check.mesh(mesh)
    p, m = len(table[0]), 1 + max(op[1] for row in table for op in row if op)
    if tuple(mesh.axis_names) != ("stage",):
        raise InputError(f"the mesh has axes {tuple(mesh.axis_names)}; pipeline_step needs a "
                         f"1-D mesh with axis 'stage', e.g. jax.make_mesh(({p},), ('stage',))")
    if mesh.shape["stage"] != p:
        raise InputError(f"the table has {p} stages but the mesh's 'stage' axis has "
                         f"{mesh.shape['stage']} devices; make the schedule for "
                         f"{mesh.shape['stage']} stages or a mesh of {p}")
    blocks = sorted({np.shape(leaf)[0] if np.ndim(leaf) else 0
                     for leaf in jax.tree.leaves(params)})
    if len(blocks) != 1 or blocks[0] % p:
        raise InputError(f"the leading axes of params hold {blocks} blocks, which do not "
                         f"split into {p} stages; stack all blocks along one leading axis "
                         f"whose size is a multiple of {p}")
    explicit = any(t == jax.sharding.AxisType.Explicit for t in mesh.axis_types)
    for leaf in jax.tree.leaves(params):
        spec = getattr(getattr(leaf, "sharding", None), "spec", None)
        if explicit and (not spec or spec[0] != "stage"):
            raise InputError("params are not split over the mesh's 'stage' axis; place them "
                             "with jax.device_put(params, NamedSharding(mesh, P('stage')))")
    check.examples(X, Y, ("X", "Y"))
    check.divisible(len(X), m, what="batch size", over="micro-batches")


def _check_sizes(num_stages: int, num_micro: int) -> None:
    check.positive(num_stages=num_stages, num_micro=num_micro)


def _check_blocks(params: dict[str, jax.Array], X: ArrayLike) -> None:
    check.tree(params)


def _check_mse(Y_hat: ArrayLike, Y: ArrayLike) -> None:
    if not jnp.size(Y):
        raise InputError(f"Y is empty (shape {jnp.shape(Y)}): the mean of no errors is not a "
                         f"loss; pass at least one target")
    if jnp.shape(Y_hat) != jnp.shape(Y):
        raise InputError(f"Y_hat has shape {jnp.shape(Y_hat)} but Y has {jnp.shape(Y)}; "
                         f"compare predictions with targets of the same shape")


StageFn = Callable[[Any, jax.Array], jax.Array]
LossFn = Callable[[jax.Array, jax.Array], jax.Array]


def _check_stage_pass(kind: ArrayLike, params: Any, x: ArrayLike, dy: ArrayLike,
                      Y_j: ArrayLike, last: ArrayLike, stage_fn: StageFn,
                      loss_fn: LossFn) -> None:
    if not (callable(stage_fn) and callable(loss_fn)):
        raise InputError("stage_fn and loss_fn must be functions: stage_fn(params, x) and "
                         "loss_fn(Y_hat, Y)")


def _check_stage_program(params: Any, X: ArrayLike, Y: ArrayLike, table: Table,
                         stage_fn: StageFn, loss_fn: LossFn) -> None:
    _check_stage_pass(0, params, X, X, Y, False, stage_fn, loss_fn)


bubble_fraction = check.validated(bubble_fraction, _check_sizes)
gpipe_order = check.validated(gpipe_order, _check_sizes)
one_f_one_b_order = check.validated(one_f_one_b_order, _check_sizes)
residual_mlp = check.validated(residual_mlp, _check_blocks)
mse = check.validated(mse, _check_mse)
stage_pass = check.validated(stage_pass, _check_stage_pass)
stage_program = check.validated(stage_program, _check_stage_program)
pipeline_schedule = check.validated(pipeline_schedule, _check_orders)
show_schedule = check.validated(show_schedule, _check_table)
in_flight = check.validated(in_flight, _check_kinds)
pipeline_step = check.validated(pipeline_step, _check_pipeline_step)
