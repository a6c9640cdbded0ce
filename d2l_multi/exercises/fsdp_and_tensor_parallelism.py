"""The checks of the exercises of notebook 09d_fsdp_and_tensor_parallelism."""
import functools
import math
import re

import numpy as np

from ._common import (
    _call,
    _close,
    _equations,
    _exercise,
    _fail,
    _mesh,
    _near,
    _observe,
    _Problem,
    _ring_bytes_per_device,
    _run,
    _scale,
    _value,
)

# --------------------------------------------------------------------------------------------
# 09d: FSDP and tensor parallelism


def _entries(spec, name):
    """A PartitionSpec as plain data: a tuple of None, names and tuples of names."""
    from jax.sharding import PartitionSpec
    spec = _value(spec, "PartitionSpec")
    if spec is None:
        spec = PartitionSpec()
    if not isinstance(spec, PartitionSpec):
        _fail(f"`{name}` should be a jax.sharding.PartitionSpec, e.g. P(None, 'data'); got "
              f"{type(spec).__name__}")
    return tuple(tuple(str(n) for n in e) if isinstance(e, (tuple, list)) else
                 (None if e is None else str(e)) for e in spec)


def _spec_axes(entries):
    names = []
    for entry in entries:
        names += list(entry) if isinstance(entry, tuple) else ([entry] if entry else [])
    return names


def _shown(entries):
    return "P(" + ", ".join(repr(e) for e in entries) + ")"


def _forward(mesh, specs, shapes, program, seed):
    """Run ``program`` on random arrays of ``shapes``, the last ones laid out by ``specs``."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec
    rng = np.random.default_rng(seed)
    arrays = [jnp.asarray(rng.normal(size=s), jnp.float32) for s in shapes]
    placed = arrays[:1] + [jax.device_put(a, NamedSharding(mesh, PartitionSpec(*s)))
                           for a, s in zip(arrays[1:], specs)]
    return np.asarray(jax.jit(program)(*placed), np.float64)


def _mlp(x, a, b):
    import jax
    return jax.nn.gelu(x @ a) @ b


@_exercise("09d_fsdp_and_tensor_parallelism", cases=["layout"],
           passed="each device holds 1/8 of the kernel")
def fsdp_spec(spec, case):
    """``spec``: the PartitionSpec that gives FSDP to a Dense kernel of shape (512, 2048) on a
    mesh with one axis, 'data', of 8 devices."""
    def probe():
        entries = _entries(spec, "spec")
        names = _spec_axes(entries)
        seen = {"spec": entries}
        if len(entries) <= 2 and set(names) <= {"data"} and len(names) == len(set(names)):
            from jax.sharding import NamedSharding, PartitionSpec
            mesh = _mesh((8,), ("data",))
            seen["shard"] = tuple(NamedSharding(mesh, PartitionSpec(*entries)).shard_shape(
                (512, 2048)))
            if case == "forward":
                seen["forward"] = _forward(mesh, [entries], [(16, 512), (512, 2048)],
                                           lambda x, w: x @ w, 0)
        return seen
    seen = _observe(probe)
    entries = seen["spec"]
    names, shown = _spec_axes(entries), _shown(entries)
    if len(entries) > 2:
        _fail(f"{shown} has {len(entries)} entries for a 2-D kernel")
    if len(names) != len(set(names)):
        _fail(f"{shown} names a mesh axis twice: each mesh axis splits at most one array axis")
    if [n for n in names if n != "data"]:
        _fail(f"{shown} names {[n for n in names if n != 'data']}: this mesh has one axis, "
              f"'data'")
    if not names:
        _fail("every device holds the whole kernel: that is data parallelism; FSDP splits "
              "each parameter over 'data' (and gathers it just before use)")
    if math.prod(seen["shard"]) * 8 != 512 * 2048:
        _fail(f"each device holds a {seen['shard']} block, not 1/8 of the kernel")
    if case == "forward":
        rng = np.random.default_rng(0)
        x, w = rng.normal(size=(16, 512)), rng.normal(size=(512, 2048))
        want = np.asarray(x, np.float32).astype(np.float64) @ np.asarray(w, np.float32)
        if not _close(seen["forward"], want, rtol=1e-4, atol=1e-3):
            _fail("a forward pass with your layout differs from the unsharded one")


@_exercise("09d_fsdp_and_tensor_parallelism", cases=["layout"],
           passed="W1 split by columns, W2 by rows: one all-reduce after W2")
def megatron_specs(specs, case):
    """``specs = (w1_spec, w2_spec)``: PartitionSpecs of the MLP y = gelu(x @ W1) @ W2, W1 of
    shape (d, 4d) and W2 of shape (4d, d), for Megatron tensor parallelism over a mesh axis
    'model': one all-reduce per MLP, none between the two layers."""
    def probe():
        pair = _value(specs, "pair of PartitionSpecs")
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            return {"pair": False}
        entries = [_entries(s, n) for s, n in zip(pair, ("w1_spec", "w2_spec"))]
        seen = {"pair": True, "specs": tuple(entries)}
        if case == "forward" and all(set(_spec_axes(e)) <= {"model"} and len(e) <= 2
                                     for e in entries):
            seen["forward"] = _forward(_mesh((8,), ("model",)), entries,
                                       [(4, 16), (16, 64), (64, 16)], _mlp, 3)
        return seen
    seen = _observe(probe)
    if not seen["pair"]:
        _fail("give two PartitionSpecs, (w1_spec, w2_spec)")
    w1, w2 = seen["specs"]
    for s, n in ((w1, "w1_spec"), (w2, "w2_spec")):
        if [a for a in _spec_axes(s) if a != "model"]:
            _fail(f"{n} = {_shown(s)}: this mesh has one axis, 'model'")
        if len(s) > 2:
            _fail(f"{n} = {_shown(s)} has {len(s)} entries for a 2-D weight")

    def split(s, axis):
        return len(s) > axis and s[axis] is not None
    if not any(split(w1, a) for a in (0, 1)) or not any(split(w2, a) for a in (0, 1)):
        which = "W1" if not any(split(w1, a) for a in (0, 1)) else "W2"
        _fail(f"{which} is replicated: tensor parallelism splits both weights over 'model'")
    if split(w1, 0) and split(w2, 1):
        _fail("both splits are the wrong way round: W1 split along its input features gives "
              "each device a partial sum of the hidden layer before the nonlinearity, and "
              "gelu(a + b) != gelu(a) + gelu(b)")
    if split(w1, 0):
        _fail("W1 split along its input features gives each device a partial sum of the hidden "
              "layer before the nonlinearity (gelu(a + b) != gelu(a) + gelu(b)): split W1's "
              "columns, its output features")
    if split(w2, 1):
        _fail("W2 split along its output features needs the whole hidden activation on every "
              "device, an all-gather between the layers: split W2's rows, its input features, "
              "so each device uses its own hidden units")
    if case == "forward":
        import jax.numpy as jnp
        rng = np.random.default_rng(3)
        x, a, b = (jnp.asarray(rng.normal(size=s), jnp.float32)
                   for s in [(4, 16), (16, 64), (64, 16)])
        if not _close(seen["forward"], np.asarray(_mlp(x, a, b)), rtol=1e-3, atol=1e-3):
            _fail("the MLP with your layout differs from the unsharded one")


# --------------------------------------------------------------------------------------------
# 09d: ZeRO-1 with Adam's state split by rows, and sequence parallelism by hand

_LR = 0.01  # the exercise's optax.adam(0.01)
_STEPS = 3  # steps the ZeRO-1 check takes and compares with one device's
_ALLREDUCES = ("psum", "psum_invariant")
_GATHERS = ("all_gather", "all_gather_invariant")
_COLLECTIVE_PRIMITIVES = {*_ALLREDUCES, *_GATHERS, "reduce_scatter", "all_to_all",
                          "ppermute", "pmax", "pmin"}


def _collectives(jaxpr):
    """Each collective a jaxpr runs (nested jaxprs included), in order: [primitive, the
    shapes of its operands]."""
    return [[eqn.primitive.name, [list(getattr(v.aval, "shape", ())) for v in eqn.invars]]
            for eqn in _equations(jaxpr) if eqn.primitive.name in _COLLECTIVE_PRIMITIVES]


def _allreduces(collectives):
    """How many allreduces of arrays (not of scalars) the program runs."""
    return sum(name in _ALLREDUCES and any(len(s) for s in shapes)
               for name, shapes in collectives)


def _count(collectives, names):
    return sum(name in names for name, _ in collectives)


def _of_arrays(ops, k):
    """The compiled collectives ``ops`` less their scalar operands (a counter such as
    lax.psum(1.0, 'data'), at most one element per device): each op's arrays of more than k
    elements, and only the ops left with some."""
    kept = [op._replace(arrays=tuple(a for a in op.arrays if math.prod(a[1]) > k))
            for op in ops]
    return [op for op in kept if op.arrays]


def _problem(e):
    """A failure of the student's code, to quote inside a sentence."""
    return str(e).rstrip(".")


def _mse(p, X, Y):
    """The loss the ZeRO-1 check trains: the notebook's two-layer network ``mse``."""
    import jax.numpy as jnp
    return jnp.mean((jnp.tanh(X @ p[0]) @ p[1] - Y) ** 2)


def _adam_problem(k, d, h):
    rng = np.random.default_rng(100 * k + d + h)
    params = [(rng.normal(size=(d, h)) / np.sqrt(d)).astype(np.float32),
              (rng.normal(size=(h, d)) / np.sqrt(h)).astype(np.float32)]
    X, Y = (rng.normal(size=(4 * k, d)).astype(np.float32) for _ in range(2))
    return params, X, Y


@functools.cache
def _adam_step():
    """One step of optax.adam on one device, compiled once."""
    import jax
    import optax

    @jax.jit
    def step(p, s, X, Y):
        updates, s = optax.adam(_LR).update(jax.grad(_mse)(p, X, Y), s, p)
        return optax.apply_updates(p, updates), s
    return step


def _adam_steps(params, X, Y):
    """``_STEPS`` steps of optax.adam on one device: each step's parameters and moments."""
    import optax
    steps, p = [], list(params)
    s = optax.adam(_LR).init(p)
    for _ in range(_STEPS):
        p, s = _adam_step()(p, s, X, Y)
        steps.append({"params": [np.asarray(a, np.float64) for a in p],
                      "mu": [np.asarray(a, np.float64) for a in s[0].mu],
                      "nu": [np.asarray(a, np.float64) for a in s[0].nu]})
    return steps


def _zero1_probe(zero1_adam, k, params, X, Y):
    """Run ``zero1_adam`` under shard_map for ``_STEPS`` steps: what each device returns each
    step, the collectives of its program and the bytes they send."""
    import jax
    import jax.numpy as jnp
    import optax
    from jax.sharding import PartitionSpec as P

    from d2l_multi.hlo import collective_ops
    from d2l_multi.matmul import ring_bytes
    mesh = _mesh((k,), ("data",))
    state = optax.adam(_LR).init([jnp.asarray(w) for w in params])
    specs = jax.tree.map(lambda a: P("data") if jnp.ndim(a) else P(), state)
    treedef = jax.tree.structure(state)

    def local(p, s, X, Y):
        out = _call(zero1_adam, "zero1_adam", p, s, X, Y, _mse)
        if not isinstance(out, (tuple, list)) or len(out) != 2 or \
                len(jax.tree.leaves(out[0])) != len(params) or \
                jax.tree.structure(out[1]) != treedef:
            _fail("return (new_params, new_state): the parameters as a list like `params`, "
                  "the state in the form optax.adam(0.01).update returns it")
        return jax.tree.map(lambda a: jnp.asarray(a)[None], (jax.tree.leaves(out[0]),
                                                              jax.tree.leaves(out[1])))
    program = jax.jit(jax.shard_map(
        local, mesh=mesh, in_specs=(P(), specs, P("data"), P("data")),
        out_specs=P("data"), check_vma=False))
    try:
        traced = _run(program.trace, params, state, X, Y, name="zero1_adam")
    except _Problem as e:
        if "ncompatible shapes" in str(e):
            twice = {(len(w) // k // k, *np.shape(w)[1:]) for w in params}
            clashing = {tuple(int(n) for n in dims.split(",") if n.strip())
                        for dims in re.findall(r"\(([\d, ]*)\)", str(e))}
            if twice & clashing:
                rows = [(len(w) // k, *np.shape(w)[1:]) for w in params]
                _fail(f"your step splits the moments again: the state arrives already "
                      f"split by rows, each device's moments of shapes {rows}, those of its "
                      f"rows of W1 and W2; give it to optax's update as it is")
            _fail(f"your step mixes whole parameters with the moments' rows "
                  f"({_problem(e)}): each device's moments are of its 1/{k} of every "
                  f"parameter's rows, so update only those rows, with their part of the "
                  f"gradient")
        if "scatter dimension" in str(e):
            _fail(f"psum_scatter cannot split a gradient ({_problem(e)}): with tiled=True "
                  f"it splits the rows into {k} blocks, one per device")
        raise
    compiled = _run(traced.lower().compile, name="zero1_adam")
    ops = _of_arrays(collective_ops(compiled.as_text()), k)
    seen = {"collectives": _collectives(traced.jaxpr.jaxpr),
            "sent": float(sum(ring_bytes(op) for op in ops)), "steps": []}
    wants = [(k, *np.shape(leaf)) if np.ndim(leaf) == 0 else
             (k, np.shape(leaf)[0] // k, *np.shape(leaf)[1:])
             for leaf in jax.tree.leaves(state)]
    p, s = params, state
    for _ in range(_STEPS):
        new_params, new_state = _run(compiled, p, s, X, Y, name="zero1_adam")
        seen["steps"].append({"params": [np.asarray(a) for a in new_params],
                              "state": [np.asarray(a) for a in new_state]})
        if [a.shape for a in new_params] != [(k, *np.shape(w)) for w in params] or \
                [a.shape for a in new_state] != wants:
            break  # shapes the next step cannot take: judged from this step
        p = [a[0] for a in new_params]
        s = jax.tree.unflatten(treedef, [a[0] if a.ndim == 1 else a.reshape(-1, *a.shape[2:])
                                         for a in new_state])
    return seen


def _wrong_rows(got, old, want, k, atol):
    """(parameter, block j, block s) where the updated block j of a parameter holds old
    block s != j, or None."""
    for n, (g, o, w) in enumerate(zip(got, old, want)):
        r = len(o) // k
        for j in range(k):
            if np.allclose(g[j * r:(j + 1) * r], w[j * r:(j + 1) * r], atol=atol):
                continue
            dist = [np.max(np.abs(g[j * r:(j + 1) * r] - o[s * r:(s + 1) * r]))
                    for s in range(k)]
            s = int(np.argmin(dist))
            if s != j and dist[s] <= 1.5 * _LR:
                return n, j, s
    return None


@_exercise("09d_fsdp_and_tensor_parallelism", cases=[(4, 12, 20)],
           passed="three steps equal optax.adam on one device; each device holds 1/k of the "
                  "moments and sends what a reduce-scatter and an all-gather send")
def zero1_adam(zero1_adam, case):
    """``zero1_adam(params, state, X, Y, loss_fn)``, one device's step under ``jax.shard_map``
    over 'data' (``check_vma=False``): ``params`` (a list of matrices) replicated, ``X``, ``Y``
    split by rows, ``state`` = ``optax.adam(0.01).init(params)`` with every moment split by
    rows and the count replicated. Reduce-scatter the gradients, update the device's rows
    with Adam, all-gather the parameters; return (new_params, new_state)."""
    k, d, h = case
    params, X, Y = _adam_problem(k, d, h)
    seen = _observe(lambda: _zero1_probe(zero1_adam, k, params, X, Y))
    first = seen["steps"][0]
    names = ["W1", "W2"]
    for name, a, w in zip(names, first["params"], params):
        if a.shape[1:] == (len(w) // k, *w.shape[1:]):
            _fail(f"each device returned only its {len(w) // k} rows of {name}: all-gather "
                  f"the updated rows (tiled=True) so that every device holds the whole "
                  f"parameter for the next forward pass")
        if a.shape[1:] != w.shape:
            _fail(f"each device returned {name} of shape {a.shape[1:]}, not {w.shape}: "
                  f"all_gather(..., tiled=True) concatenates the k blocks of rows")
    count, moments = first["state"][0], first["state"][1:]
    for a, w in zip(moments, params + params):
        if a.shape[1:] == w.shape:
            _fail(f"each device returned moments of shape {w.shape}, a whole parameter's: "
                  f"ZeRO-1 keeps on each device the moments of its 1/{k} of the rows only, "
                  f"{(len(w) // k, *w.shape[1:])}")
        if a.shape[1:] != (len(w) // k, *w.shape[1:]):
            _fail(f"each device returned moments of shape {a.shape[1:]}: return the state "
                  f"optax's update gives for its rows, {(len(w) // k, *w.shape[1:])}")
    ops = seen["collectives"]
    if _allreduces(ops):
        _fail("your program allreduces (lax.psum) the gradients: every device receives the "
              "whole gradient but updates only its rows; lax.psum_scatter(..., tiled=True) "
              "gives each device the sum of its rows, for half the bytes")
    whole = [shapes[0] for name, shapes in ops if name in _GATHERS and shapes and
             shapes[0] in [list(np.shape(w)) for w in params]]
    if whole:
        _fail(f"your program all-gathers whole gradients (shapes {whole}): each device "
              f"receives all {k} devices' gradients, k\u00d7 the bytes it needs; "
              f"lax.psum_scatter(..., tiled=True) sums them and leaves each device the sum "
              f"of its rows, for the bytes of one all-gather")
    if not _count(ops, ("reduce_scatter", "all_to_all")):
        _fail("your program has no reduce-scatter (lax.psum_scatter) of the gradients: each "
              "device's gradient is of its own part of the batch; reduce-scatter them "
              "(tiled=True) and divide by k for the mean")
    for name, a in zip(names, first["params"]):
        if not all(np.array_equal(a[0], b) for b in a[1:]):
            _fail(f"the devices hold different {name} after a step: all-gather the rows "
                  f"each device updated, so that all hold the same parameters")
    wants = _adam_steps(params, X, Y)
    if not np.all(np.asarray(count) == 1):
        moved = any(np.any(m != 0) for m in moments)
        _fail("your state did not change: return the state optax's update gives back "
              "(its count and moments), not the one you were given" if not moved else
              f"the step count is {np.ravel(count)[0]} after the first step: return the "
              f"state optax's update gives back, whose count is 1")
    mu = [np.asarray(m, np.float64).reshape(-1, *m.shape[2:]) for m in moments[:2]]
    r = _scale(mu, wants[0]["mu"])
    if _near(r, k):
        _fail(f"your first moment is {k}\u00d7 too large: psum_scatter sums the {k} "
              f"devices' gradients; divide by {k} for the mean gradient of the whole batch "
              f"(Adam's step hides the factor, its moments do not)")
    if _near(r, 1 / k):
        _fail(f"your first moment is {k}\u00d7 too small: the gradient was averaged twice")
    if r is not None and r > 0 and not _near(r, 1) and _near(k / r, round(k / r), 1e-4):
        _fail(f"your first moment is {r:.4g}\u00d7 the mean gradient's: you divided the "
              f"sum of the {k} devices' gradients by {round(k / r)}; divide by "
              f"k = lax.axis_size('data'), not a number")
    for t, (step, want) in enumerate(zip(seen["steps"], wants), 1):
        got = [np.asarray(a[0], np.float64) for a in step["params"]]
        if not all(_close(a, b, rtol=1e-5, atol=1e-5) for a, b in zip(got, want["params"])):
            old = [np.asarray(w, np.float64) for w in (params if t == 1 else
                                                       wants[t - 2]["params"])]
            rows = _wrong_rows(got, old, want["params"], k, 1e-5) if t == 1 else None
            if rows is not None:
                n, j, s = rows
                r = len(params[n]) // k
                _fail(f"row block {j} of {names[n]} holds old row block {s}, updated: "
                      f"device i must update rows i\u00b7{r} to (i+1)\u00b7{r} of "
                      f"{names[n]} (i = lax.axis_index('data')), those psum_scatter gave "
                      f"it the gradient of")
            diff = max(float(np.max(np.abs(a - b))) for a, b in zip(got, want["params"]))
            _fail(f"after step {t} your parameters differ from optax.adam(0.01)'s on one "
                  f"device by up to {diff:.2g}")
        moments = [np.asarray(m, np.float64).reshape(-1, *m.shape[2:])
                   for m in step["state"][1:]]
        for m, w in zip(moments, want["mu"] + want["nu"]):
            if not _close(m, w, rtol=1e-3, atol=1e-4 * float(np.max(np.abs(w)))):
                _fail(f"after step {t} your moments differ from those of optax.adam(0.01) "
                      f"on one device: update them with the mean gradient of your rows")
    n = sum(w.nbytes for w in params)
    ring = _ring_bytes_per_device(k, n)
    if not math.isclose(seen["sent"], ring, rel_tol=1e-6):
        _fail(f"each device sends {seen['sent'] / n:.7g} n per step (n: the parameters' "
              f"bytes); a reduce-scatter of the gradients and an all-gather of the "
              f"parameters send {ring / n:.7g} n")


def _sp_problem(k, T, d):
    rng = np.random.default_rng(10 * k + T + d)
    x = rng.normal(size=(T, d)).astype(np.float32)
    W1 = (rng.normal(size=(d, 4 * d)) / np.sqrt(d)).astype(np.float32)
    W2 = (rng.normal(size=(4 * d, d)) / np.sqrt(4 * d)).astype(np.float32)
    cotangent = rng.normal(size=(T, d)).astype(np.float32)
    return x, W1, W2, cotangent


def _sp_probe(sp_mlp, k, x, W1, W2, cotangent):
    """Run ``sp_mlp`` under shard_map: the output, the collectives of the forward program,
    and (when each device returns its T/k tokens) the gradient through it and the kinds of
    collectives of the backward program."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from d2l_multi.hlo import collective_ops
    mesh = _mesh((k,), ("model",))
    specs = (P("model"), P(None, "model"), P("model"))
    f = jax.shard_map(lambda x, W1, W2: _call(sp_mlp, "sp_mlp", x, W1, W2), mesh=mesh,
                      in_specs=specs, out_specs=P("model"))
    args = [jax.device_put(a, NamedSharding(mesh, s)) for a, s in zip((x, W1, W2), specs)]
    try:
        traced = _run(jax.jit(f).trace, *args, name="sp_mlp")
    except _Problem as e:
        if "reduce_scatter" in str(e) or "scatter dimension" in str(e):
            _fail(f"psum_scatter cannot split your array ({_problem(e)}): it needs all "
                  f"{len(x)} tokens on each device, so all-gather x (tiled=True) before the "
                  f"first matmul")
        if "reshape" in str(e):
            _fail(f"your reshape fails on {k} devices ({_problem(e)}): the gathered tokens "
                  f"come in k = lax.axis_size('model') blocks; use that, not a number, or "
                  f"all_gather(..., tiled=True), which concatenates them")
        raise
    forward = _run(traced.lower().compile, name="sp_mlp")
    y = np.asarray(_run(forward, *args, name="sp_mlp"))
    seen = {"y": y, "collectives": _collectives(traced.jaxpr.jaxpr),
            "forward": [op.kind for op in _of_arrays(collective_ops(forward.as_text()), k)]}
    if y.shape != x.shape:
        return seen
    backward = jax.jit(lambda x, W1, W2, c: jax.vjp(f, x, W1, W2)[1](c))
    c = jax.device_put(cotangent, NamedSharding(mesh, P("model")))
    compiled = _run(lambda: backward.lower(*args, c).compile(), name="sp_mlp")
    seen["grads"] = [np.asarray(g) for g in _run(compiled, *args, c, name="sp_mlp")]
    seen["backward"] = [op.kind for op in _of_arrays(collective_ops(compiled.as_text()), k)]
    return seen


@_exercise("09d_fsdp_and_tensor_parallelism", cases=[(4, 24, 8)],
           passed="the one-device MLP and its gradient, from one all-gather of the tokens "
                  "and one reduce-scatter, no allreduce forward or backward")
def sp_mlp(sp_mlp, case):
    """``sp_mlp(x, W1, W2)``, one device's part of gelu(x W1) W2 under ``jax.shard_map`` over
    'model' (in_specs ``(P('model'), P(None, 'model'), P('model'))``, out_specs
    ``P('model')``): the tokens x arrive split, one all-gather of them before W1 and one
    reduce-scatter after W2 leave each device its T/k tokens of the output."""
    k, T, d = case
    x, W1, W2, cotangent = _sp_problem(k, T, d)
    seen = _observe(lambda: _sp_probe(sp_mlp, k, x, W1, W2, cotangent))
    y, ops = seen["y"], seen["collectives"]
    mine = (y.shape[0] // k, *y.shape[1:]) if y.ndim else ()
    gathers = [shapes[0] for name, shapes in ops if name in _GATHERS and shapes]
    if mine != (T // k, d):
        if mine == (T, d) and _allreduces(ops):
            _fail(f"every device holds all {T} tokens of the output: lax.psum adds the "
                  f"partial sums and gives each device all of them; "
                  f"lax.psum_scatter(..., tiled=True) adds them and leaves each device its "
                  f"{T // k} tokens")
        if not gathers:
            _fail(f"each device returned shape {mine}, not its {T // k} tokens "
                  f"{(T // k, d)}: without an all-gather each device multiplies only its "
                  f"own {T // k} tokens; gather the tokens before the first matmul")
        if len(mine) != 2:
            _fail(f"each device returned shape {mine}: all_gather and psum_scatter with "
                  f"tiled=False add or remove an axis of size k; tiled=True concatenates "
                  f"and splits along the tokens")
        _fail(f"each device returned shape {mine}: return its {T // k} tokens of the "
              f"output, shape {(T // k, d)}")
    if not gathers:
        _fail(f"your program has no all-gather: each device multiplied only its own "
              f"{T // k} tokens by its columns of W1, and the sum over the devices added "
              f"partial sums of different tokens; gather the tokens before the first matmul")
    weights = [list(np.shape(W1))[:1] + [4 * d // k], [4 * d // k] + list(np.shape(W2))[1:]]
    if any(s in weights for s in gathers):
        _fail(f"you gather arrays of shapes {gathers}, among them the weights' blocks "
              f"{weights}: gathering the weights is FSDP; sequence parallelism gathers x "
              f"and reduce-scatters the output, each device keeping its columns of W1 and "
              f"rows of W2")
    if [T, d] in gathers:
        _fail(f"you all-gather the ({T}, {d}) partial sums and add them: each device "
              f"receives all {k} devices' partial sums, an allreduce's bytes by another "
              f"route; lax.psum_scatter(..., tiled=True) adds them and leaves each device "
              f"its {T // k} tokens")
    if any(s != [T // k, d] for s in gathers):
        _fail(f"you gather arrays of shapes {gathers}: gather only the tokens "
              f"x, {[T // k, d]}, before the first matmul")
    if _allreduces(ops):
        _fail("your program allreduces (lax.psum): every device receives all tokens' sums "
              "and keeps a T/k of them; lax.psum_scatter(..., tiled=True) sums and splits "
              "in one collective, for half the bytes")
    scatters = _count(ops, ("reduce_scatter", "all_to_all"))
    if len(gathers) != 1 or scatters != 1:
        _fail(f"your forward program runs {len(gathers)} all-gathers and {scatters} "
              f"reduce-scatters: one all-gather and one reduce-scatter are needed")
    import jax
    want, vjp = jax.vjp(_mlp, x, W1, W2)
    if not _close(y, want, rtol=1e-4, atol=1e-5):
        diff = float(np.max(np.abs(y - np.asarray(want))))
        if diff < 1e-3:
            _fail(f"your output differs from one device's gelu(x W1) W2 by up to "
                  f"{diff:.2g}: use jax.nn.gelu with its default tanh approximation, as the "
                  f"notebook's mlp does")
        _fail(f"your output differs from one device's gelu(x W1) W2 by up to {diff:.2g}")
    if "all-reduce" in seen["forward"]:
        _fail(f"the compiled forward program runs {seen['forward']}: no allreduce is needed")
    for name, g, w in zip(("x", "W1", "W2"), seen["grads"], vjp(cotangent)):
        w = np.asarray(w)
        if not _close(g, w, rtol=1e-4, atol=1e-5 * max(1.0, float(np.max(np.abs(w))))):
            _fail(f"the gradient through your sp_mlp with respect to {name} differs from one "
                  f"device's by up to {float(np.max(np.abs(g - w))):.2g}")
    if "all-reduce" in seen["backward"]:
        _fail(f"differentiating through your sp_mlp runs {seen['backward']}: the transpose "
              f"of an all-gather is a reduce-scatter and vice versa, no allreduce")
