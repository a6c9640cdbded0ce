"""Exercises that check themselves: ``d2l.verify_NAME(answer)`` runs the student's function or
value on small cases with the simulated devices and prints ``PASS NAME: ...``, or fails
with one line that says what is wrong in the exercise's terms ("your update is 8x too large:
did you psum instead of pmean?") -- never the answer, never a traceback.

A failed check raises ``CheckFailed``, an ``AssertionError`` that Jupyter shows as that one line
(``_render_traceback_``), so nbgrader scores the cell 0 (docs/classroom.md). ``hidden=True``
adds the cases a teacher's autograder runs beyond the public ones: other sizes, other numbers
of devices, other seeds. ``CHECKS`` maps each check to the notebook it belongs to.

Every check takes only what the student wrote and builds its own small problem, so it runs in
seconds on a laptop CPU with 8 simulated devices.
"""
import functools
import math

import numpy as np

CHECKS = {}  # check name: the notebook whose exercise it checks


class CheckFailed(AssertionError):
    """A check's verdict against the student's answer: one line, shown without a traceback."""

    def _render_traceback_(self):  # IPython shows these lines instead of a traceback
        return [str(self)]


class _Problem(Exception):
    """Raised inside a check: the reason, completed with the check's name by ``_exercise``."""


def _exercise(notebook):
    """Register a check of ``notebook``; it fails with ``CheckFailed('FAIL name: why')``."""
    def register(check):
        CHECKS[check.__name__] = notebook
        exercise = check.__name__.removeprefix("verify_")

        @functools.wraps(check)
        def run(*answers, hidden=False):
            try:
                passed = check(*answers, hidden=hidden)
            except _Problem as e:
                raise CheckFailed(f"FAIL {exercise}: {e}") from None
            extra = " (and the hidden cases)" if hidden else ""
            print(f"PASS {exercise}: {passed}{extra}")
        return run
    return register


def _fail(why):
    raise _Problem(why)


def _first_line(error):
    text = str(error).strip().splitlines()
    line = text[0] if text else ""
    return line if len(line) <= 200 else line[:197] + "..."


def _shown_name(fn, name):
    """The name the student gave ``fn`` (``name`` if none; a lambda is "your function")."""
    name = getattr(fn, "__name__", name)
    return name if name.isidentifier() else "your function"


def _call(fn, name, *args, **kwargs):
    """``fn(*args)``, or fail saying why: not written yet, an exception, no result."""
    name = _shown_name(fn, name)
    if fn is Ellipsis:
        _fail(f"`{name}` is still `...`: write the function")
    if not callable(fn):
        _fail(f"`{name}` should be a function, got {type(fn).__name__}")
    try:
        out = fn(*args, **kwargs)
    except _Problem:
        raise
    except NotImplementedError:
        _fail(f"`{name}` is not written yet (it raises NotImplementedError): write its body")
    except Exception as e:  # the student's bug, reported in one line
        _fail(f"`{name}` raised {type(e).__name__}: {_first_line(e)}")
    if out is None:
        _fail(f"`{name}` returned None: write its body where it says `...`, and return the "
              f"result")
    return out


def _value(value, what):
    if value is Ellipsis:
        _fail(f"your {what} is still `...`: replace it with your answer")
    return value


def _run(program, *args, name="your function"):
    """Run a JAX program built around the student's code; a JAX error fails the check."""
    try:
        return program(*args)
    except _Problem:
        raise
    except Exception as e:
        _fail(f"running `{name}` failed with {type(e).__name__}: {_first_line(e)}")


def _number(x, name):
    try:
        x = float(x)
    except (TypeError, ValueError):
        _fail(f"`{name}` should return a number, got {type(x).__name__}")
    if not math.isfinite(x):
        _fail(f"`{name}` returned {x}")
    return x


def _close(a, b, rtol=1e-6, atol=0.0):
    return bool(np.allclose(np.asarray(a, np.float64), np.asarray(b, np.float64), rtol=rtol,
                            atol=atol))


def _times(got, want):
    """How many times ``want`` ``got`` is, for a message: '8x too large', '2x too small'."""
    r = got / want
    if r >= 1:
        return f"{r:.3g}\u00d7 too large"
    return f"{1 / r:.3g}\u00d7 too small" if r > 0 else f"{r:.3g}\u00d7 the right value"


def _scale(got, want):
    """The number r with got = r * want (flattened pytrees of arrays), or None if none fits."""
    import jax
    g = np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(got)])
    w = np.concatenate([np.ravel(np.asarray(x, np.float64)) for x in jax.tree.leaves(want)])
    if g.shape != w.shape or not np.all(np.isfinite(g)):
        return None
    ww = float(w @ w)
    if ww == 0:
        return None
    r = float(g @ w) / ww
    return r if np.linalg.norm(g - r * w) <= 1e-4 * max(np.linalg.norm(w) * max(1, abs(r)),
                                                        1e-30) else None


def _near(r, value, rtol=1e-3):
    return r is not None and abs(r - value) <= rtol * abs(value)


def _same_structure(got, want, what):
    import jax
    gs = [np.shape(x) for x in jax.tree.leaves(got)]
    ws = [np.shape(x) for x in jax.tree.leaves(want)]
    if jax.tree.structure(got) != jax.tree.structure(want) or gs != ws:
        _fail(f"returned {len(gs)} arrays of shapes {gs}: return {what} with the structure "
              f"and shapes of the parameters ({ws})")


def _devices(k):
    import jax
    devices = jax.devices()
    if len(devices) < k:
        _fail(f"this check needs {k} devices but JAX sees {len(devices)}: run "
              f"d2l.simulate_devices(8) before anything else uses JAX (the notebook's first "
              f"cell), then restart the kernel")
    return devices[:k]


def _mesh(shape, names):
    from jax.sharding import Mesh
    return Mesh(np.array(_devices(math.prod(shape))).reshape(shape), names)


def _update_problem(got, params, want, k, what="update"):
    """Explain why the parameters ``got`` differ from ``want`` (both after one step)."""
    import jax
    delta_got = jax.tree.map(lambda a, p: np.asarray(a, np.float64) - p, got, params)
    delta_want = jax.tree.map(lambda a, p: np.asarray(a, np.float64) - p, want, params)
    r = _scale(delta_got, delta_want)
    if r is not None and abs(r) < 1e-6:
        _fail("the parameters did not change: apply the update to them and return the result")
    if _near(r, k):
        _fail(f"your {what} is {k}\u00d7 too large: did you psum instead of pmean? (the mean "
              f"gradient over the {k} devices is the whole batch's gradient)")
    if _near(r, 1 / k):
        _fail(f"your {what} is {k}\u00d7 too small: the gradients were averaged twice (pmean "
              f"already divides by the {k} devices)")
    if _near(r, -1):
        _fail(f"your {what} climbs the loss: subtract lr \u00d7 gradient")
    if r is not None:
        _fail(f"your {what} is {_times(r, 1)} (compared with one device's step on the whole "
              f"batch): check the learning rate and the averaging")
    diff = max(float(np.max(np.abs(a - b))) for a, b in
               zip(jax.tree.leaves(delta_got), jax.tree.leaves(delta_want)))
    _fail(f"your {what} differs from one device's step on the whole batch by up to {diff:.2g}")


# --------------------------------------------------------------------------------------------
# 00: devices and shardings

@_exercise("00_devices")
def verify_mesh_layout(place, hidden=False):
    """``place(x, mesh)`` lays a 2-D array out with rows split over mesh axis 'x' and columns
    over 'y'."""
    import jax
    import jax.numpy as jnp
    cases = [((2, 4), (6, 8))] + ([((4, 2), (8, 6)), ((2, 2), (4, 10))] if hidden else [])
    for mesh_shape, shape in cases:
        mesh = _mesh(mesh_shape, ("x", "y"))
        x = jnp.arange(math.prod(shape), dtype=jnp.float32).reshape(shape)
        out = _call(place, "place", x, mesh)
        if not isinstance(out, jax.Array):
            _fail(f"returned a {type(out).__name__}: put the array on the devices with "
                  f"jax.device_put(x, NamedSharding(mesh, ...))")
        if not np.array_equal(np.asarray(out), np.asarray(x)):
            _fail("the values changed: lay the array out, do not transform it")
        devices = out.sharding.device_set
        if len(devices) == 1:
            _fail(f"your array lives on one device ({next(iter(devices))}): give it a "
                  f"NamedSharding over the whole mesh")
        rows, cols = shape[0] // mesh_shape[0], shape[1] // mesh_shape[1]
        got = tuple(out.sharding.shard_shape(shape))
        if got == shape:
            _fail(f"every device holds the whole {shape} array (replicated): name the mesh "
                  f"axis that splits each array axis in the PartitionSpec")
        if got == (rows, shape[1]):
            _fail(f"each shard is {got}: the rows are split but not the columns; split the "
                  f"second axis over 'y'")
        if got == (shape[0], cols):
            _fail(f"each shard is {got}: the columns are split but not the rows; split the "
                  f"first axis over 'x'")
        if got != (rows, cols):
            _fail(f"each shard is {got}, expected {(rows, cols)} on a {mesh_shape} mesh: rows "
                  f"over 'x', columns over 'y'")
        for i in range(mesh_shape[0]):
            for j in range(mesh_shape[1]):
                index = out.sharding.devices_indices_map(shape)[mesh.devices[i, j]]
                if (index[0].start or 0) != i * rows or (index[1].start or 0) != j * cols:
                    _fail(f"the device at mesh position ({i}, {j}) holds the wrong block: rows "
                          f"follow mesh axis 'x' and columns axis 'y', in order")
    return "rows over 'x', columns over 'y': each device holds its block"


# --------------------------------------------------------------------------------------------
# 01: LeNet from scratch

def _log_softmax_loss(logits, y):
    logits = np.asarray(logits, np.float64)
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return -logp[np.arange(len(y)), y].mean()


@_exercise("01_lenet_from_scratch")
def verify_cross_entropy(cross_entropy, hidden=False):
    """``cross_entropy(logits, y)``: the mean softmax cross-entropy of (batch, classes) logits
    against integer labels, finite even for large logits."""
    import jax.numpy as jnp
    rng = np.random.default_rng(1)
    cases = [(8, 10, 3.0), (8, 10, 1000.0)]
    if hidden:
        cases += [(5, 3, 1.0), (16, 4, -800.0)]
    for n, c, scale in cases:
        logits = rng.normal(size=(n, c)).astype(np.float32) * abs(scale)
        logits[:, 0] += np.sign(scale) * abs(scale)
        y = rng.integers(0, c, size=n)
        got = _call(cross_entropy, "cross_entropy", jnp.asarray(logits), jnp.asarray(y))
        if np.shape(got) != ():
            _fail(f"returned shape {np.shape(got)}: return one number, the mean over the "
                  f"batch")
        got = float(got)
        want = _log_softmax_loss(logits, y)
        if not math.isfinite(got):
            _fail(f"your loss is {got} for logits of size ~{abs(scale):g}: exp overflows in "
                  f"float32; subtract each row's largest logit first (what jax.nn.log_softmax "
                  f"does)")
        if _close(got, want, rtol=1e-4, atol=1e-4):
            continue
        if _close(got, want * n, rtol=1e-4):
            _fail(f"your loss is {n}\u00d7 too large (the batch size): average over the "
                  f"examples instead of summing")
        if _close(got, -want, rtol=1e-4):
            _fail("your loss has the wrong sign: it is minus the log-probability of the label")
        z = logits.astype(np.float64) - logits.max(axis=0, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=0, keepdims=True))  # over the batch: a mistake
        if _close(got, -logp[np.arange(n), y].mean(), rtol=1e-4):
            _fail("you normalised over the batch axis (0): the softmax runs over the classes "
                  "(the last axis)")
        _fail(f"your loss is {got:.4g} where the mean cross-entropy is {want:.4g} "
              f"(batch {n}, {c} classes)")
    return "the mean cross-entropy, finite even for logits of 1000"


@_exercise("01_lenet_from_scratch")
def verify_sgd_update(sgd, hidden=False):
    """``sgd(params, grads, lr)``: one SGD step on any pytree of parameters."""
    rng = np.random.default_rng(2)
    trees = [[rng.normal(size=(3, 2)), rng.normal(size=2)]]
    if hidden:
        trees.append({"w": rng.normal(size=(4,)), "b": [rng.normal(size=(2, 2))]})
    import jax
    for params in trees:
        params = jax.tree.map(lambda a: np.asarray(a, np.float32), params)
        grads = jax.tree.map(lambda a: np.ones_like(a) * 0.5 + a, params)
        want = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
        got = _call(sgd, "sgd", params, grads, 0.1)
        _same_structure(got, want, "the new parameters")
        r = _scale(jax.tree.map(lambda a, p: np.asarray(a) - p, got, params),
                   jax.tree.map(lambda a, p: a - p, want, params))
        if _near(r, -1):
            _fail("your step climbs the loss: subtract lr \u00d7 gradient")
        if _near(r, 10):
            _fail("your step ignores the learning rate: multiply the gradient by lr")
        if r is None or not _near(r, 1):
            _fail("some parameters moved by the wrong amount: every array p becomes "
                  "p - lr * g (jax.tree.map applies that to each)")
    return "every parameter moves by -lr \u00d7 its gradient"


# --------------------------------------------------------------------------------------------
# 02: allreduce

_COLLECTIVES = {"psum", "all_gather", "reduce_scatter", "all_to_all", "pmax", "pmin",
                "psum_invariant", "pbroadcast", "all_gather_invariant"}


def _primitives(jaxpr, found=None):
    found = set() if found is None else found
    for eqn in jaxpr.eqns:
        found.add(eqn.primitive.name)
        for param in eqn.params.values():
            for sub in param if isinstance(param, (list, tuple)) else [param]:
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    _primitives(inner, found)
    return found


def _per_device(fn, name, x, k):
    """Run ``fn(local, 'data')`` with ``shard_map`` on k devices, ``x`` stacking the k local
    inputs along axis 0: (the stacked results, the set of primitives the program uses)."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P
    mesh = _mesh((k,), ("data",))

    def local(block):
        return jnp.asarray(_call(fn, name, block[0], "data"))[None]
    program = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P("data"),
                                    out_specs=P("data"), check_vma=False))
    traced = _run(program.trace, x, name=name)
    out = _run(traced.lower().compile(), x, name=name)
    return np.asarray(out, np.float64), _primitives(traced.jaxpr.jaxpr)


def _only_ppermute(prims, fn, name):
    used = sorted(prims & _COLLECTIVES)
    if used:
        _fail(f"`{_shown_name(fn, name)}` uses {', '.join(used)}: write it with lax.ppermute "
              f"alone (plus lax.axis_index and arithmetic)")


@_exercise("02_allreduce")
def verify_broadcast(broadcast, hidden=False):
    """``broadcast(x, axis_name)``, per device: every device ends with device 0's ``x``."""
    for k in [8] + ([4] if hidden else []):
        x = np.random.default_rng(k).normal(size=(k, 3)).astype(np.float32) + 2
        out, _ = _per_device(broadcast, "broadcast", x, k)
        if out.shape != x.shape:
            _fail(f"each device returned shape {out.shape[1:]}: return an array shaped like x")
        if _close(out, np.broadcast_to(x[0], x.shape), rtol=1e-5, atol=1e-6):
            continue
        if _close(out, np.broadcast_to(x.sum(0), x.shape), rtol=1e-5):
            _fail(f"every device holds the sum of all {k} values, not device 0's: zero out "
                  f"the other devices' values before the psum")
        if _close(out, np.broadcast_to(x[0] / k, x.shape), rtol=1e-5):
            _fail(f"every device holds 1/{k} of device 0's value: psum (a sum) of one nonzero "
                  f"value is that value; pmean divides by {k}")
        if _close(out, x, rtol=1e-6):
            _fail("each device kept its own value: nothing was communicated")
        if _close(out, np.broadcast_to(x[-1], x.shape), rtol=1e-5):
            _fail("every device holds the last device's value: broadcast device 0's")
        _fail("the devices do not all hold device 0's value")
    return "every device holds device 0's value"


def _ring_inputs(k, c):
    """Random blocks, and blocks where device d holds 2**d everywhere (a sum names who
    contributed: bit d set = device d's value was added)."""
    rng = np.random.default_rng(k * 100 + c)
    x = rng.normal(size=(k, k * c)).astype(np.float32)
    bits = np.broadcast_to(2.0 ** np.arange(k)[:, None], (k, k * c)).astype(np.float32)
    return x, bits


def _missing_devices(out_bits, k):
    full = 2 ** k - 1
    counts = {bin(int(v)).count("1") for v in np.ravel(out_bits)
              if float(v).is_integer() and 0 < v <= full}
    return min(counts) if counts else None


@_exercise("02_allreduce")
def verify_reduce_scatter(reduce_scatter, hidden=False):
    """``reduce_scatter(x, axis_name)``, per device, with ``lax.ppermute``: x holds k chunks;
    device i returns the sum over the devices of chunk i."""
    for k, c in [(8, 2)] + ([(4, 3)] if hidden else []):
        x, bits = _ring_inputs(k, c)
        out, prims = _per_device(reduce_scatter, "reduce_scatter", x, k)
        _only_ppermute(prims, reduce_scatter, "reduce_scatter")
        if out.shape == (k, k * c):
            _fail(f"each device returned all {k} chunks ({k * c} values): return only chunk "
                  f"i's sum, {c} values")
        if out.shape != (k, c):
            _fail(f"each device returned shape {out.shape[1:]}: return chunk i's sum, shape "
                  f"({c},)")
        sums = x.reshape(k, k, c).sum(0)  # sums[j] = the sum of chunk j
        if _close(out, sums, rtol=1e-5, atol=1e-5):
            continue
        if _close(out, sums / k, rtol=1e-5, atol=1e-5):
            _fail(f"{k}\u00d7 too small: a reduce-scatter sums the chunks, it does not average")
        for s in range(1, k):
            if _close(out, np.roll(sums, -s, axis=0), rtol=1e-5, atol=1e-5):
                _fail(f"device i holds the sum of chunk i+{s} (mod {k}), not chunk i: shift "
                      f"which chunk each device sends first by {s}")
        out_bits, _ = _per_device(reduce_scatter, "reduce_scatter", bits, k)
        m = _missing_devices(out_bits, k)
        if m is not None and m < k:
            _fail(f"the sums add up only {m} of the {k} devices' chunks: a ring needs k-1 = "
                  f"{k - 1} steps, each adding one more device's chunk")
        _fail("device i does not hold the sum over the devices of chunk i")
    return "device i holds the sum of chunk i, from ppermute alone"


@_exercise("02_allreduce")
def verify_all_gather(all_gather, hidden=False):
    """``all_gather(x, axis_name)``, per device, with ``lax.ppermute``: every device returns
    the k devices' chunks, concatenated in device order."""
    for k, c in [(8, 2)] + ([(4, 3)] if hidden else []):
        x = (np.arange(k)[:, None] * 10 + np.arange(c)).astype(np.float32) + 1
        out, prims = _per_device(all_gather, "all_gather", x, k)
        _only_ppermute(prims, all_gather, "all_gather")
        if out.shape != (k, k * c):
            _fail(f"each device returned shape {out.shape[1:]}: return the {k} chunks "
                  f"concatenated, shape ({k * c},)")
        want = np.broadcast_to(x.reshape(-1), (k, k * c))
        if _close(out, want):
            continue
        blocks = out.reshape(k, k, c)
        if np.any(np.all(blocks == 0, axis=-1)):
            _fail(f"some positions still hold zeros: after k-1 = {k - 1} steps every device "
                  f"has received all the other chunks")
        for i in range(k):
            for j in range(k):
                src = [d for d in range(k) if np.array_equal(blocks[i, j], x[d])]
                if src and src[0] != j:
                    _fail(f"chunks out of order: position {j} on device {i} holds device "
                          f"{src[0]}'s chunk; put each received chunk at the position of the "
                          f"device it came from")
        _fail("the gathered chunks are not the devices' chunks in device order")
    return "every device holds all chunks in device order, from ppermute alone"


@_exercise("02_allreduce")
def verify_ring_allreduce(allreduce, hidden=False):
    """``allreduce(x, axis_name)``, per device, with ``lax.ppermute``: every device returns the
    sum of the devices' ``x``, for any length of ``x``."""
    for k, n in [(8, 16)] + ([(4, 10), (8, 3)] if hidden else []):
        x = np.random.default_rng(n).normal(size=(k, n)).astype(np.float32)
        try:
            out, prims = _per_device(allreduce, "allreduce", x, k)
        except _Problem as e:
            if n % k:
                _fail(f"fails for an array of {n} values on {k} devices: when the length does "
                      f"not divide into k chunks, pad it ({e})")
            raise
        _only_ppermute(prims, allreduce, "allreduce")
        if out.shape != (k, n):
            _fail(f"each device returned shape {out.shape[1:]}: return the sum, shaped like x "
                  f"({n},)")
        want = np.broadcast_to(x.sum(0), (k, n))
        if _close(out, want, rtol=1e-5, atol=1e-5):
            continue
        if _close(out, want / k, rtol=1e-5, atol=1e-5):
            _fail(f"{k}\u00d7 too small: an allreduce sums; averaging is pmean's job")
        bits = np.broadcast_to(2.0 ** np.arange(k)[:, None], (k, n)).astype(np.float32)
        out_bits, _ = _per_device(allreduce, "allreduce", bits, k)
        full = np.isclose(out_bits, 2 ** k - 1)
        if full.any() and not full.all():
            _fail("only some values hold the full sum: after the reduce-scatter, pass the "
                  "finished chunks around the ring (the all-gather)")
        m = _missing_devices(out_bits, k)
        if m is not None and m < k:
            _fail(f"the sums add up only {m} of the {k} devices' values: the reduce-scatter "
                  f"needs k-1 = {k - 1} steps")
        _fail("the devices do not all hold the sum of the devices' arrays")
    return "every device holds the sum, from ppermute alone"


@_exercise("02_allreduce")
def verify_ring_bytes(bytes_sent, hidden=False):
    """``bytes_sent(n, k)``: the bytes each device sends in a ring allreduce of n bytes."""
    cases = [(1024, 8), (10**6, 2), (4 * 10**6, 4)]
    if hidden:
        cases += [(12, 3), (2**30, 16), (7, 1)]
    for n, k in cases:
        got = _number(_call(bytes_sent, "bytes_sent", n, k), "bytes_sent")
        want = 2 * (k - 1) / k * n
        if _close(got, want, rtol=1e-9):
            continue
        if k > 1 and _close(got, 2 * (k - 1) * n):
            _fail(f"{k}\u00d7 too large for k={k}: each of the ring's steps sends one chunk of "
                  f"n/k bytes, not the whole array")
        if _close(got, (k - 1) / k * n):
            _fail("half the traffic: count both phases, the reduce-scatter and the all-gather")
        if _close(got, 2 * n) or _close(got, n):
            _fail(f"your count does not depend on k (n={n}, k={k}): how many chunks does "
                  f"each device send in each phase, and how large is a chunk?")
        if k == 1:
            _fail("with one device there is nothing to send")
        _fail(f"for n={n} bytes on k={k} devices you count {got:g} bytes, "
              f"{_times(got, want)}")
    return "2(k-1)/k \u00d7 n bytes per device"


# --------------------------------------------------------------------------------------------
# 03: data parallelism from scratch

@_exercise("03_data_parallel_from_scratch")
def verify_split_batch(split_batch, hidden=False):
    """``split_batch(X, y, num_devices)``: k consecutive equal shards along a new leading axis;
    a ValueError naming the batch size when it does not divide."""
    cases = [(16, 8, (3,))] + ([(12, 4, (2, 2)), (6, 1, ())] if hidden else [])
    for n, k, feature in cases:
        X = np.arange(n * math.prod(feature), dtype=np.float32).reshape(n, *feature)
        y = np.arange(n) % 10
        out = _call(split_batch, "split_batch", X, y, k)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            _fail("return two arrays, (X_shards, y_shards)")
        Xs, ys = (np.asarray(a) for a in out)
        if Xs.shape != (k, n // k, *feature):
            _fail(f"X_shards has shape {Xs.shape} for a batch of {n} on {k} devices: a new "
                  f"leading axis of {k} shards, each {n // k} examples")
        if ys.shape != (k, n // k):
            _fail(f"y_shards has shape {ys.shape}: split the labels like the images")
        if not np.array_equal(Xs.reshape(X.shape), X):
            first = Xs[0].reshape(n // k, -1)[:, 0] // max(1, math.prod(feature))
            _fail(f"shard 0 holds examples {first.astype(int).tolist()}: split the batch "
                  f"into consecutive blocks (examples 0..{n // k - 1} on device 0)")
        if not np.array_equal(ys.reshape(-1), y):
            _fail("the labels no longer match the images: split y exactly like X")
    for n, k in [(20, 8)] + ([(10, 4), (7, 2)] if hidden else []):
        X, y = np.zeros((n, 3), np.float32), np.zeros(n, np.int32)
        try:
            out = split_batch(X, y, k)
        except ValueError as e:
            if "reshape" in str(e):
                _fail(f"a batch of {n} on {k} devices fails inside a reshape "
                      f"({_first_line(e)}): check the size first and raise a ValueError that "
                      f"names the batch size")
            if str(n) not in str(e):
                _fail(f"your ValueError should name the batch size ({n}) so the reader knows "
                      f"what to change; it says: {_first_line(e)}")
            continue
        except NotImplementedError:
            _call(split_batch, "split_batch", X, y, k)
        except Exception as e:
            _fail(f"a batch of {n} on {k} devices raised {type(e).__name__} ({_first_line(e)}):"
                  f" check the size first and raise a ValueError that names it")
        try:
            kept = int(np.prod(np.shape(out[0])[:2]))
        except Exception:
            kept = None
        if kept is not None and kept < n:
            _fail(f"a batch of {n} on {k} devices silently lost {n - kept} examples: the "
                  f"mean gradient would ignore them; raise a ValueError that names the batch "
                  f"size instead")
        _fail(f"a batch of {n} does not split into {k} equal shards, yet your function "
              f"returned: raise a ValueError that names the batch size")
    return "equal consecutive shards, and a ValueError naming a batch that does not divide"


def _softmax_problem(seed, n, features=4, classes=3):
    import jax
    rng = np.random.default_rng(seed)
    params = [rng.normal(size=(features, classes)).astype(np.float32),
              rng.normal(size=classes).astype(np.float32)]
    X = rng.normal(size=(n, features)).astype(np.float32)
    y = rng.integers(0, classes, size=n).astype(np.int32)
    return jax.tree.map(np.asarray, params), X, y


def _softmax_loss(params, X, y):
    """Mean softmax cross-entropy of a linear model, the loss these checks train."""
    import jax
    import jax.numpy as jnp
    W, b = params
    logp = jax.nn.log_softmax(X @ W + b)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


@functools.cache
def _softmax_grad():
    import jax
    return jax.jit(jax.grad(_softmax_loss))


def _reference_step(params, X, y, lr):
    grads = _softmax_grad()(params, X, y)
    return [np.asarray(p, np.float64) - lr * np.asarray(g, np.float64)
            for p, g in zip(params, grads)]


@_exercise("03_data_parallel_from_scratch")
def verify_pmean_step(step, hidden=False):
    """``step(params, X, y, loss_fn, lr)``, per device under ``jax.pmap(...,
    axis_name='devices')``: one data-parallel SGD step on the local shard."""
    import jax
    for k, n, lr in [(8, 32, 0.1)] + ([(4, 12, 0.5)] if hidden else []):
        params, X, y = _softmax_problem(k + n, n)
        want = _reference_step(params, X, y, lr)
        replicated = [np.broadcast_to(p, (k, *p.shape)) for p in params]
        program = jax.pmap(lambda p, X, y: _call(step, "step", p, X, y, _softmax_loss, lr),
                           axis_name="devices", devices=_devices(k))
        got = _run(program, replicated, X.reshape(k, n // k, -1), y.reshape(k, -1),
                   name="step")
        _same_structure(jax.tree.map(lambda a: a[0], got), want, "the new parameters")
        got = [np.asarray(a, np.float64) for a in got]
        spread = max(float(np.max(np.abs(a - a[:1]))) for a in got)
        if spread > 1e-5:
            _fail("the devices disagree after one step: each moved by its own shard's "
                  "gradient. Average the gradients over 'devices' (lax.pmean) before the update")
        got0 = [a[0] for a in got]
        if not all(_close(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(got0, want)):
            _update_problem(got0, [np.asarray(p, np.float64) for p in params], want, k)
    return "equal on every device to one SGD step on the whole batch"


@_exercise("03_data_parallel_from_scratch")
def verify_grad_accumulation(accumulated_step, hidden=False):
    """``accumulated_step(params, X, y, loss_fn, lr, num_micro)``, on one device: the gradients
    of ``num_micro`` micro-batches accumulated into one SGD step, equal to one data-parallel
    step on ``num_micro`` devices."""
    for n, m, lr in [(32, 4, 0.1)] + ([(24, 3, 0.3), (8, 1, 0.1)] if hidden else []):
        params, X, y = _softmax_problem(n + m, n)
        want = _reference_step(params, X, y, lr)
        got = _call(accumulated_step, "accumulated_step", params, X, y, _softmax_loss, lr, m)
        _same_structure(got, want, "the new parameters")
        got = [np.asarray(a, np.float64) for a in got]
        if all(_close(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(got, want)):
            continue
        p64 = [np.asarray(p, np.float64) for p in params]
        last = _reference_step(params, X[-(n // m):], y[-(n // m):], lr)
        if m > 1 and all(_close(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(got, last)):
            _fail("only the last micro-batch's gradient counted: add the gradients up across "
                  "the micro-batches")
        sequential = params
        for Xm, ym in zip(np.split(X, m), np.split(y, m)):
            sequential = [np.asarray(a, np.float32)
                          for a in _reference_step(sequential, Xm, ym, lr)]
        if m > 1 and all(_close(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(got, sequential)):
            _fail(f"you updated after every micro-batch: that is {m} small SGD steps, not one "
                  f"step on the whole batch. Accumulate first, update once")
        r = _scale([a - p for a, p in zip(got, p64)], [a - p for a, p in zip(want, p64)])
        if m > 1 and _near(r, m):
            _fail(f"your update is {m}\u00d7 too large: you summed the {m} micro-batch "
                  f"gradients; divide by their number to get the batch's mean gradient (what "
                  f"pmean gives on {m} devices)")
        _update_problem(got, p64, want, m)
    return "one update with the mean gradient of the micro-batches = one data-parallel step"


# --------------------------------------------------------------------------------------------
# 04a: jit and shardings

@_exercise("04a_jit_and_shardings")
def verify_jit_data_parallel(place, hidden=False):
    """``place(params, X, y, mesh)``: the parameters replicated, the batch split along its
    first axis over the mesh's 'data' axis, so that ``jax.jit`` runs the step data parallel."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P
    step = jax.jit(lambda p, X, y: [a - 0.1 * g for a, g in
                                    zip(p, jax.grad(_softmax_loss)(p, X, y))])
    for k, n in [(8, 32)] + ([(4, 8)] if hidden else []):
        mesh = _mesh((k,), ("data",))
        params, X, y = _softmax_problem(n, n, features=8, classes=8)
        out = _call(place, "place", params, X, y, mesh)
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            _fail("return three things: (params, X, y) laid out on the mesh")
        p, Xs, ys = out
        for what, arrays in [("the parameters", jax.tree.leaves(p)), ("X", [Xs]), ("y", [ys])]:
            if not all(isinstance(a, jax.Array) for a in arrays):
                _fail(f"{what} are still host arrays: place them with jax.device_put")
            if not all(len(a.sharding.device_set) == k for a in arrays):
                _fail(f"{what} are not on all {k} devices of the mesh")

        def split(a, axis):
            return a.sharding.shard_shape(a.shape)[axis] < a.shape[axis]
        if any(split(a, ax) for a in jax.tree.leaves(p) for ax in range(a.ndim)):
            _fail("your parameters are split over the devices: each device needs all of them "
                  "(replicate them with P())")
        if Xs.ndim > 1 and split(Xs, 1) and not split(Xs, 0):
            _fail("you split X along axis 1 (its features): split the batch axis, 0")
        if not split(Xs, 0):
            _fail("every device holds the whole batch X: shard it over 'data' along axis 0")
        if not split(ys, 0):
            _fail("y is replicated while X is split: shard y over 'data' too")
        if not Xs.sharding.is_equivalent_to(NamedSharding(mesh, P("data")), Xs.ndim):
            _fail("X is split, but not by the mesh's 'data' axis in device order")
        got = _run(step, p, Xs, ys, name="the step on your layout")
        want = _reference_step(params, X, y, 0.1)
        if not all(_close(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(got, want)):
            _fail("the step on your layout differs from one device's step")
    return "parameters replicated, batch split over 'data': jit's step equals one device's"


# --------------------------------------------------------------------------------------------
# 04b: shard_map

@_exercise("04b_shard_map")
def verify_shard_map_grad(global_grad, hidden=False):
    """``global_grad(params, X, y, loss_fn)``, per device under ``jax.shard_map`` with
    ``check_vma=True`` over axis 'data' (params P(), X and y P('data'), output P()): the
    gradient of the whole batch's mean loss."""
    import jax
    from jax.sharding import PartitionSpec as P
    for k, n in [(8, 32)] + ([(4, 12)] if hidden else []):
        mesh = _mesh((k,), ("data",))
        params, X, y = _softmax_problem(3 * n, n)
        want = [np.asarray(g, np.float64) for g in _softmax_grad()(params, X, y)]
        program = jax.jit(jax.shard_map(
            lambda p, X, y: _call(global_grad, "global_grad", p, X, y, _softmax_loss),
            mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=P()))
        got = _run(program, params, X, y, name="global_grad")
        _same_structure(got, want, "the gradient")
        got = [np.asarray(g, np.float64) for g in got]
        if all(_close(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(got, want)):
            continue
        r = _scale(got, want)
        if _near(r, k):
            _fail(f"your gradient is {k}\u00d7 too large: with check_vma=True, the gradient "
                  f"of replicated parameters is summed over the devices. Differentiate the "
                  f"mean of the local losses (lax.pmean), not their sum, and do not reduce "
                  f"the gradient again")
        if _near(r, 1 / k):
            _fail(f"your gradient is {k}\u00d7 too small: it was averaged twice")
        if r is not None:
            _fail(f"your gradient is {_times(r, 1)}")
        _fail("your gradient is not the whole batch's gradient (is it one device's own?)")
    return "the whole batch's gradient, without the k-fold error"


# --------------------------------------------------------------------------------------------
# 05a: Flax

@_exercise("05a_flax")
def verify_nnx_step(train_step, hidden=False):
    """``train_step(model, optimizer, X, y)``: one optimizer step on the mean softmax
    cross-entropy of ``model(X)``, in place, returning the loss. Run under ``nnx.jit`` with a
    replicated model and a batch sharded over 8 devices, it must equal one device's step."""
    import jax
    import optax
    from flax import nnx
    from jax.sharding import NamedSharding, PartitionSpec as P

    def reference(model, optimizer, X, y):
        def loss_fn(model):
            return optax.softmax_cross_entropy_with_integer_labels(model(X), y).mean()
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    def make():
        model = nnx.Linear(4, 3, rngs=nnx.Rngs(0))
        return model, nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)

    one_device = nnx.jit(reference)
    sharded = nnx.jit(lambda m, o, X, y: _call(train_step, "train_step", m, o, X, y))
    mesh, n = _mesh((8,), ("data",)), 32
    for seed in [1] + ([2, 3] if hidden else []):  # hidden: other batches, same shapes
        _, X, y = _softmax_problem(50 + seed, n)
        model_1, opt_1 = make()
        before = jax.tree.map(np.asarray, nnx.state(model_1, nnx.Param))
        loss_1 = one_device(model_1, opt_1, X, y)
        model_k, opt_k = make()
        nnx.update((model_k, opt_k), jax.device_put(nnx.state((model_k, opt_k)),
                                                    NamedSharding(mesh, P())))
        batch = jax.device_put((X, y), NamedSharding(mesh, P("data")))
        loss_k = _run(sharded, model_k, opt_k, *batch, name="train_step")
        want = jax.tree.map(np.asarray, nnx.state(model_1, nnx.Param))
        got = jax.tree.map(np.asarray, nnx.state(model_k, nnx.Param))
        if not all(_close(a, b, rtol=1e-4, atol=1e-6) for a, b in
                   zip(jax.tree.leaves(got), jax.tree.leaves(want))):
            delta = [a - b for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(before))]
            r = _scale(delta, [a - b for a, b in zip(jax.tree.leaves(want),
                                                     jax.tree.leaves(before))])
            if _near(r, n):
                _fail(f"your update is {n}\u00d7 too large (the global batch): the loss sums "
                      f"over the examples; take the mean, so the step does not grow with the "
                      f"batch or the number of devices")
            if r is not None and abs(r) < 1e-6:
                _fail("the parameters did not change: apply the gradients with "
                      "optimizer.update(model, grads)")
            if _near(r, -1):
                _fail("your update climbs the loss: differentiate the loss itself")
            _fail("the step on 8 devices differs from one device's step on the whole batch")
        if not _close(_number(loss_k, "train_step"), float(loss_1), rtol=1e-4):
            _fail("the parameters are right but the returned loss is not the batch's mean "
                  "loss")
    return "the sharded step equals one device's step"


# --------------------------------------------------------------------------------------------
# 05b: batch normalization

@_exercise("05b_batchnorm")
def verify_batch_stats(batch_stats, hidden=False):
    """``batch_stats(x, axis_name)``, per device on its (m, features) examples: the mean and
    variance of the global batch, the same on every device."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import PartitionSpec as P
    for k, m in [(8, 4)] + ([(4, 6)] if hidden else []):
        mesh = _mesh((k,), ("data",))
        rng = np.random.default_rng(k * m)
        x = (rng.normal(size=(k, m, 3)) + 3 * np.arange(k)[:, None, None]).astype(np.float32)

        def local(block):
            out = _call(batch_stats, "batch_stats", block[0], "data")
            if not isinstance(out, (tuple, list)) or len(out) != 2:
                _fail("return two arrays, (mean, var)")
            return tuple(jnp.asarray(a)[None] for a in out)
        program = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P("data"),
                                        out_specs=P("data"), check_vma=False))
        mean, var = (np.asarray(a, np.float64) for a in _run(program, x, name="batch_stats"))
        flat = x.reshape(k * m, 3).astype(np.float64)
        if mean.shape != (k, 3) or var.shape != (k, 3):
            _fail(f"mean and var should have one value per feature, shape (3,); got "
                  f"{mean.shape[1:]} and {var.shape[1:]}")
        local_mean = x.mean(axis=1)
        if _close(mean, local_mean, rtol=1e-4):
            _fail(f"each device's mean is that of its own {m} examples: BatchNorm across "
                  f"devices needs the global batch's mean (pmean of the local means)")
        if _close(mean, local_mean.sum(0, keepdims=True).repeat(k, 0), rtol=1e-4):
            _fail(f"the mean is {k}\u00d7 too large: psum adds the {k} local means; pmean "
                  f"averages them")
        if not _close(mean, np.broadcast_to(flat.mean(0), (k, 3)), rtol=1e-4, atol=1e-5):
            _fail("the mean is not the global batch's mean")
        if _close(var, np.broadcast_to(x.var(axis=1).mean(0), (k, 3)), rtol=1e-4):
            _fail("your variance misses the spread between the devices' means: average "
                  "E[x\u00b2] (or the squared deviations from the global mean) over the "
                  "devices, not the local variances")
        if _close(var, x.var(axis=1), rtol=1e-4):
            _fail("each device's variance is that of its own examples: average over the "
                  "devices too")
        if not _close(var, np.broadcast_to(flat.var(0), (k, 3)), rtol=1e-3, atol=1e-4):
            _fail("the variance is not the global batch's variance")
    return "the global batch's mean and variance on every device"


# --------------------------------------------------------------------------------------------
# 05c: ResNet and arithmetic per byte

@_exercise("05c_resnet")
def verify_flops_per_byte(flops_per_gradient_byte, hidden=False):
    """``flops_per_gradient_byte(layers, batch_per_device)``: a training step's FLOPs per byte
    of float32 gradient; ``layers`` lists (parameters, uses of each parameter per example)."""
    cases = [([(1000, 1), (500, 1)], 32),                         # dense layers
             ([(3 * 3 * 16 * 32, 14 * 14), (800 * 128, 1)], 16)]  # a convolution and a dense
    if hidden:
        cases += [([(64, 100)], 1), ([(10, 1), (10, 9), (5, 4)], 128)]
    for layers, b in cases:
        got = _number(_call(flops_per_gradient_byte, "flops_per_gradient_byte", layers, b),
                      "flops_per_gradient_byte")
        params = sum(p for p, _ in layers)
        want = 6 * b * sum(p * r for p, r in layers) / (4 * params)
        if _close(got, want, rtol=1e-6):
            continue
        if _close(got, want / 3):
            _fail("3\u00d7 too small: you counted the forward pass only; the backward pass "
                  "costs about twice as much (6 FLOPs per parameter use, not 2)")
        if _close(got, want * 4):
            _fail("4\u00d7 too large: that is FLOPs per gradient value; a float32 gradient "
                  "takes 4 bytes")
        if _close(got, 6 * b / 4):
            _fail("you left out the reuse: a convolution uses each weight at every output "
                  "position, so multiply each layer's parameters by its uses per example")
        if _close(got, want / b):
            _fail("your count does not grow with the batch: every example costs the same "
                  "FLOPs, while the gradient's size stays the same")
        _fail(f"{_times(got, want)} for layers {layers} and {b} examples per device")
    return "6 FLOPs per parameter use per example, over 4 bytes per gradient value"


# --------------------------------------------------------------------------------------------
# 06: Keras

@_exercise("06_keras")
def verify_keras_step(make_train_step, hidden=False):
    """``make_train_step(model, loss_fn, optimizer)`` returns a stateless
    ``train_step(state, X, y) -> (loss, state)`` with state = (trainable, non-trainable,
    optimizer variables); jit-compiled on a batch sharded over 8 devices it must equal one
    device's step, BatchNorm's moving statistics included."""
    import os
    import sys
    if "keras" in sys.modules:
        import keras
        if keras.backend.backend() != "jax":
            _fail(f"Keras runs on {keras.backend.backend()}: set "
                  f"os.environ['KERAS_BACKEND'] = 'jax' before importing keras, then restart")
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import jax
    import keras
    from jax.sharding import NamedSharding, PartitionSpec as P

    from .keras_models import keras_train_state, make_keras_train_step

    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5),
                                  keras.layers.BatchNormalization(), keras.layers.Dense(3)])
        optimizer = keras.optimizers.SGD(0.1)
        return model, optimizer, keras_train_state(model, optimizer)

    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model, optimizer, initial = build()
    one_device = make_keras_train_step(model, loss_fn, optimizer)  # the library's, jitted
    step = _call(make_train_step, "make_train_step", model, loss_fn, optimizer)
    sharded = jax.jit(lambda s, X, y: _call(step, "train_step", s, X, y))
    mesh = _mesh((8,), ("data",))
    for seed in [1] + ([2, 3] if hidden else []):  # hidden: other batches, same shapes
        _, X, y = _softmax_problem(70 + seed, 32)
        want_loss, want = one_device(initial, X, y)
        state = jax.device_put(initial, NamedSharding(mesh, P()))
        batch = jax.device_put((X, y), NamedSharding(mesh, P("data")))
        out = _run(sharded, state, *batch, name="train_step")
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            _fail("train_step should return (loss, state)")
        got_loss, got = out
        if jax.tree.structure(got) != jax.tree.structure(want):
            _fail("the new state should have the structure of the old: (trainable, "
                  "non-trainable, optimizer variables)")
        same = [_close(a, b, rtol=1e-4, atol=1e-6) for a, b in
                zip(jax.tree.leaves(got), jax.tree.leaves(want))]
        if all(same) and _close(_number(got_loss, "train_step"), float(want_loss), rtol=1e-4):
            continue
        trainable_ok = all(_close(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(got[0], want[0]))
        moving_ok = all(_close(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(got[1], want[1]))
        moving_same = all(_close(a, b) for a, b in zip(got[1], state[1]))
        trained_same = all(_close(a, b) for a, b in zip(got[0], state[0]))
        if trainable_ok and moving_same:
            _fail("BatchNorm's moving statistics did not change: return the non-trainable "
                  "variables that stateless_call gives back")
        if trained_same:
            _fail("the trainable variables did not change: apply the gradients with "
                  "optimizer.stateless_apply")
        if moving_same:
            _fail("BatchNorm's moving statistics did not change: call the model with "
                  "training=True and keep the non-trainable variables it returns")
        if not trainable_ok or not moving_ok:
            _fail("the step on 8 devices differs from one device's step")
        _fail("the returned loss is not the batch's mean loss")
    return "the sharded stateless step equals one device's, moving statistics included"


# --------------------------------------------------------------------------------------------
# 07a: collectives and the alpha-beta model

@_exercise("07a_collectives")
def verify_alpha_beta(allreduce_time, hidden=False):
    """``allreduce_time(n, k, alpha, beta)``: the alpha-beta model's seconds for a ring
    allreduce of n bytes on k devices (alpha seconds per step, beta seconds per byte)."""
    cases = [(8, 1e-5, 1e-10), (4, 2e-6, 5e-11)]
    if hidden:
        cases += [(2, 1e-4, 1e-9), (16, 3e-6, 2e-11)]
    for k, alpha, beta in cases:
        def model(n):
            return _number(_call(allreduce_time, "allreduce_time", n, k, alpha, beta),
                           "allreduce_time")
        tiny, large = model(4.0), model(4e9)  # alpha dominates the first, beta the second
        want_tiny = 2 * (k - 1) * alpha + 2 * (k - 1) / k * 4.0 * beta
        want_large = 2 * (k - 1) * alpha + 2 * (k - 1) / k * 4e9 * beta
        if _close(tiny, want_tiny, rtol=1e-6) and _close(large, want_large, rtol=1e-6):
            continue
        if not _close(tiny, want_tiny, rtol=1e-3):
            _fail(f"for a tiny message (4 bytes, k={k}) your time is "
                  f"{_times(tiny, want_tiny)}: every step of the ring pays the start-up "
                  f"alpha; how many steps does a ring allreduce take?")
        if _close(large / want_large, k, rtol=1e-2):
            _fail(f"for large messages your time is {k}\u00d7 too large: each step moves n/k "
                  f"bytes, not n")
        if _close(large / want_large, 0.5, rtol=1e-2):
            _fail("for large messages your time is half the model's: the bytes cross the ring "
                  "twice (reduce-scatter, then all-gather)")
        _fail(f"for a large message (4e9 bytes, k={k}) your time is "
              f"{_times(large, want_large)}: count the bytes each device sends")
    return "2(k-1) alpha + 2(k-1)/k n beta"


@_exercise("07a_collectives")
def verify_bus_bandwidth(bus_bandwidth, hidden=False):
    """``bus_bandwidth(collective, k, n, seconds)``: nccl-tests' bus bandwidth in bytes/s of
    'psum', 'all_gather' or 'psum_scatter' moving n bytes in ``seconds`` on k devices."""
    factors = {"psum": lambda k: 2 * (k - 1) / k, "all_gather": lambda k: (k - 1) / k,
               "psum_scatter": lambda k: (k - 1) / k}
    cases = [("psum", 8, 2**20, 1e-3), ("all_gather", 8, 2**20, 1e-3),
             ("psum_scatter", 4, 2**24, 2e-3)]
    if hidden:
        cases += [("psum", 2, 10**6, 1e-4), ("all_gather", 16, 3 * 2**20, 5e-3)]
    for collective, k, n, t in cases:
        got = _number(_call(bus_bandwidth, "bus_bandwidth", collective, k, n, t),
                      "bus_bandwidth")
        want = n / t * factors[collective](k)
        if _close(got, want, rtol=1e-6):
            continue
        if _close(got, n / t):
            _fail(f"that is the algorithm bandwidth n/t of {collective}: the bus bandwidth "
                  f"multiplies it by the fraction of the data each device's link carries")
        if collective != "psum" and _close(got, n / t * 2 * (k - 1) / k):
            _fail(f"{collective} is one phase of the ring, not two")
        if collective == "psum" and _close(got, n / t * (k - 1) / k):
            _fail("an allreduce crosses the ring twice (reduce-scatter, then all-gather)")
        _fail(f"for {collective} on {k} devices your bus bandwidth is {_times(got, want)}")
    return "algorithm bandwidth \u00d7 the collective's factor"


# --------------------------------------------------------------------------------------------
# 07b: predicting a data-parallel step

@_exercise("07b_predicting_steps")
def verify_step_time(predict_step_time, hidden=False):
    """``predict_step_time(compute_time, k, grad_bytes, alpha, beta)``: seconds of a
    data-parallel step on k devices, ``compute_time`` being one device's time for the whole
    global batch; the allreduce follows the compute (no overlap)."""
    cases = [(0.8, 8, 4e8, 1e-5, 1e-10), (0.05, 2, 4e6, 5e-6, 1e-9), (2.0, 1, 4e9, 1e-5,
                                                                      1e-10)]
    if hidden:
        cases += [(1.0, 16, 1e9, 2e-6, 4e-11), (0.3, 4, 0.0, 1e-5, 1e-9)]
    for compute, k, g, alpha, beta in cases:
        got = _number(_call(predict_step_time, "predict_step_time", compute, k, g, alpha,
                            beta), "predict_step_time")
        comm = 2 * (k - 1) * alpha + 2 * (k - 1) / k * g * beta
        want = compute / k + comm
        if _close(got, want, rtol=1e-6):
            continue
        if k > 1 and _close(got, compute + comm):
            _fail(f"each of the {k} devices computes 1/{k} of the global batch: divide the "
                  f"compute time by k")
        if k > 1 and _close(got, compute / k):
            _fail("no communication: add the ring allreduce of the gradient")
        if k == 1 and not _close(got, want):
            _fail("on one device there is no allreduce: the step is the compute alone")
        if _close(got, max(compute / k, comm)):
            _fail("the allreduce waits for the gradient here (no overlap): add the two times")
        _fail(f"for {k} devices your step time is {_times(got, want)}")
    return "compute / k + the ring allreduce of the gradient"


# --------------------------------------------------------------------------------------------
# 07c: mixed precision

@_exercise("07c_mixed_precision")
def verify_master_weights(mixed_step, hidden=False):
    """``mixed_step(master, grads, lr)``: one SGD step with float32 master weights and
    bfloat16 gradients; returns (new float32 master weights, their bfloat16 copy for the next
    forward pass)."""
    import jax.numpy as jnp
    for lr, g, steps in [(0.1, 1e-3, 100)] + ([(0.01, 2e-3, 300)] if hidden else []):
        master = jnp.ones(4, jnp.float32)
        grads = jnp.full(4, g, jnp.bfloat16)
        for _ in range(steps):
            out = _call(mixed_step, "mixed_step", master, grads, lr)
            if not isinstance(out, (tuple, list)) or len(out) != 2:
                _fail("return two arrays: (float32 master weights, bfloat16 copy)")
            master, copy = out
            if jnp.asarray(master).dtype != jnp.float32:
                _fail(f"your master weights are {jnp.asarray(master).dtype}: keep them float32 "
                      f"and cast only the copy for the forward pass")
        want = 1.0 - steps * lr * float(jnp.asarray(g, jnp.bfloat16))
        if _close(master, 1.0):
            _fail(f"after {steps} steps of lr \u00d7 g = {lr * g:g} your weights have not moved: "
                  f"in bfloat16, 1.0 - {lr * g:g} rounds back to 1.0 (lost updates); apply the "
                  f"update to the float32 master weights")
        if not _close(master, want, rtol=1e-4):
            _fail(f"after {steps} steps your master weights are {float(master[0]):.6f}, "
                  f"{_times(1 - float(master[0]), 1 - want)} a change")
        if jnp.asarray(copy).dtype != jnp.bfloat16:
            _fail(f"the copy for the forward pass is {jnp.asarray(copy).dtype}: make it "
                  f"bfloat16")
        if not _close(jnp.asarray(copy, jnp.float32), jnp.asarray(master, jnp.bfloat16)
                      .astype(jnp.float32)):
            _fail("the bfloat16 copy is not the master weights rounded to bfloat16")
    return "float32 master weights keep the small updates bfloat16 would lose"


# --------------------------------------------------------------------------------------------
# 08: ensembles

@_exercise("08_ensembles")
def verify_ensemble_average(ensemble_probs, hidden=False):
    """``ensemble_probs(logits)``: logits of shape (members, batch, classes) -> the ensemble's
    class probabilities (batch, classes), the average of the members' probabilities."""
    import jax.numpy as jnp
    cases = [(4, 6, 3)] + ([(8, 5, 10), (2, 16, 2)] if hidden else [])
    for m, n, c in cases:
        rng = np.random.default_rng(m * n * c)
        logits = rng.normal(size=(m, n, c)).astype(np.float32) * 3
        logits[0] *= 10  # one confident member: averaging logits and probabilities differ
        got = np.asarray(_call(ensemble_probs, "ensemble_probs", jnp.asarray(logits)),
                         np.float64)
        z = logits - logits.max(-1, keepdims=True)
        probs = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
        want = probs.mean(0)
        if got.shape == (m, c):
            _fail(f"you averaged over the examples (axis 1): average over the members "
                  f"(axis 0), giving shape ({n}, {c})")
        if got.shape != (n, c):
            _fail(f"returned shape {got.shape}: one row of probabilities per example, "
                  f"({n}, {c})")
        if _close(got, want, rtol=1e-4, atol=1e-6):
            continue
        mean_logits = logits.mean(0)
        if _close(got, mean_logits, rtol=1e-4):
            _fail("you averaged the logits and stopped: average the members' probabilities "
                  "(softmax first), so each row sums to 1")
        z = mean_logits - mean_logits.max(-1, keepdims=True)
        if _close(got, np.exp(z) / np.exp(z).sum(-1, keepdims=True), rtol=1e-4):
            _fail("you averaged the logits, then took the softmax: average the members' "
                  "probabilities (softmax first, then the mean)")
        if not _close(got.sum(-1), 1.0, rtol=1e-4):
            _fail("the rows do not sum to 1: return probabilities")
        _fail("the probabilities are not the average of the members' probabilities")
    return "the mean of the members' softmax probabilities"


# --------------------------------------------------------------------------------------------
# 09a: memory and rematerialisation

@_exercise("09a_memory_and_remat")
def verify_training_memory(bytes_per_device, hidden=False):
    """``bytes_per_device(num_params, activation_bytes, k, strategy)``: bytes each of k devices
    holds to train with Adam in float32 (parameters, gradients, two moments, activations) under
    strategy 'dp', 'fsdp' or 'tp' (tensor parallelism splits every weight, not the batch)."""
    cases = [(10**9, 4 * 10**9, 8), (10**6, 10**8, 4)]
    if hidden:
        cases += [(3 * 10**8, 0, 16), (5000, 100, 2)]
    for P_, A, k in cases:
        want = {"dp": 16 * P_ + A / k, "fsdp": 16 * P_ / k + A / k, "tp": 16 * P_ / k + A}
        for strategy in ("dp", "fsdp", "tp"):
            got = _number(_call(bytes_per_device, "bytes_per_device", P_, A, k, strategy),
                          "bytes_per_device")
            w = want[strategy]
            if _close(got, w, rtol=1e-9):
                continue
            state = got - (A / k if strategy != "tp" else A)
            per = state / (P_ / (1 if strategy == "dp" else k))
            if _close(per, 8):
                _fail(f"{strategy}: you left out Adam's two moments; with the parameters and "
                      f"gradients that is four float32 values, 16 bytes per parameter")
            if _close(per, 12) or _close(per, 4):
                _fail(f"{strategy}: count four float32 values per parameter (parameter, "
                      f"gradient, Adam's two moments), 16 bytes")
            if strategy == "fsdp" and _close(got, want["dp"]):
                _fail("fsdp: FSDP splits the parameters, gradients and optimizer state over "
                      "the k devices; here every device holds all of them")
            if strategy == "fsdp" and _close(got, 4 * P_ / k + 12 * P_ + A / k):
                _fail("fsdp: you split only the parameters; FSDP splits the gradients and the "
                      "optimizer state too")
            if strategy == "tp" and _close(got, want["fsdp"]):
                _fail("tp: tensor parallelism does not split the batch: every device computes "
                      "on every example, so it holds all the activations")
            if strategy == "dp" and _close(got, 16 * P_ + A):
                _fail("dp: each device computes on 1/k of the batch, so it holds 1/k of the "
                      "activations")
            if A and _close(got, w - (A / k if strategy != "tp" else A)):
                _fail(f"{strategy}: add the activations")
            _fail(f"{strategy}: {_times(got, w)} for {P_:g} parameters on {k} devices")
    return "16 bytes per parameter, divided as each strategy splits it, plus activations"


@_exercise("09a_memory_and_remat")
def verify_remat_memory(activation_bytes, hidden=False):
    """``activation_bytes(num_layers, input_bytes, inside_bytes, remat)``: the activations a
    backward pass keeps for L identical layers, each with an input of ``input_bytes`` and
    intermediate values of ``inside_bytes``; with ``remat`` each layer is rematerialised."""
    cases = [(12, 100, 400), (4, 10**6, 3 * 10**6)]
    if hidden:
        cases += [(1, 8, 16), (96, 2**20, 2**23)]
    for L, a, b in cases:
        for remat in (False, True):
            got = _number(_call(activation_bytes, "activation_bytes", L, a, b, remat),
                          "activation_bytes")
            want = L * a + b if remat else L * (a + b)
            if _close(got, want, rtol=1e-9):
                continue
            if not remat:
                _fail(f"without remat every layer keeps its input and its intermediate values:"
                      f" {_times(got, want)} for {L} layers")
            if _close(got, L * a):
                _fail("with remat the backward pass recomputes one layer at a time and holds "
                      "that layer's intermediate values meanwhile: add one layer's worth")
            if _close(got, L * (a + b)):
                _fail("with remat only each layer's input is kept, not its intermediate values")
            if _close(got, a + b):
                _fail(f"every layer's input is still kept: {L} of them")
            _fail(f"with remat: {_times(got, want)} for {L} layers")
    return "L inputs plus one layer being recomputed"


# --------------------------------------------------------------------------------------------
# 09b: Transformer and meshes

_LOGICAL = ("batch", "embed", "heads", "mlp", "vocab")


@_exercise("09b_transformer_and_meshes")
def verify_logical_rules(rules, hidden=False):
    """``rules``: a dict from each logical axis of the Transformer (batch, embed, heads, mlp,
    vocab) to a mesh axis of a ('data', 'model') mesh, or None, giving data parallelism over
    'data' and Megatron tensor parallelism over 'model'."""
    rules = _value(rules, "rules")
    if not isinstance(rules, dict):
        _fail(f"`rules` should be a dict from logical axis to mesh axis, got "
              f"{type(rules).__name__}")
    missing = [a for a in _LOGICAL if a not in rules]
    if missing:
        _fail(f"name every logical axis, None meaning replicated: missing {missing}")
    unknown = [a for a in rules if a not in _LOGICAL]
    if unknown:
        _fail(f"{unknown} are not logical axes of the Transformer; use {list(_LOGICAL)}")

    def axes(v):
        return set(v) if isinstance(v, (tuple, list)) else ({v} if v is not None else set())
    for a, v in rules.items():
        if not axes(v) <= {"data", "model"}:
            _fail(f"'{a}' maps to {v!r}: the mesh's axes are 'data' and 'model' (or None)")
    if axes(rules["batch"]) != {"data"}:
        _fail("data parallelism splits the batch: map 'batch' to 'data'")
    if "model" in axes(rules["embed"]):
        _fail("mapping 'embed' to 'model' splits every activation's features, so each layer "
              "would need an all-gather: Megatron keeps 'embed' whole (None)")
    if "data" in axes(rules["embed"]):
        _fail("mapping 'embed' to 'data' shards the weights over 'data': that is FSDP, not "
              "this strategy")
    for a in ("heads", "mlp"):
        if axes(rules[a]) != {"model"}:
            _fail(f"tensor parallelism splits the '{a}' axis over 'model' (each device keeps "
                  f"some attention heads and some hidden units)")
    if "data" in axes(rules["vocab"]):
        _fail("'vocab' over 'data' would shard the embedding table over the data axis; use "
              "'model' or None")
    return "batch over 'data'; heads and mlp over 'model'; embed whole"


# --------------------------------------------------------------------------------------------
# 09c: FSDP and tensor parallelism

def _as_spec(spec, name):
    from jax.sharding import PartitionSpec
    spec = _value(spec, "PartitionSpec")
    if spec is None:
        spec = PartitionSpec()
    if not isinstance(spec, PartitionSpec):
        _fail(f"`{name}` should be a jax.sharding.PartitionSpec, e.g. P(None, 'data'); got "
              f"{type(spec).__name__}")
    return spec


def _spec_axes(spec):
    names = []
    for entry in spec:
        names += list(entry) if isinstance(entry, (tuple, list)) else (
            [entry] if entry is not None else [])
    return names


@_exercise("09c_fsdp_and_tensor_parallelism")
def verify_fsdp_spec(spec, hidden=False):
    """``spec``: the PartitionSpec that gives FSDP to a Dense kernel of shape (512, 2048) on a
    mesh with one axis, 'data', of 8 devices."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    spec = _as_spec(spec, "spec")
    names = _spec_axes(spec)
    if len(spec) > 2:
        _fail(f"{spec} has {len(spec)} entries for a 2-D kernel")
    if len(names) != len(set(names)):
        _fail(f"{spec} names a mesh axis twice: each mesh axis splits at most one array axis")
    if [n for n in names if n != "data"]:
        _fail(f"{spec} names {[n for n in names if n != 'data']}: this mesh has one axis, "
              f"'data'")
    if not names:
        _fail("every device holds the whole kernel: that is data parallelism; FSDP splits "
              "each parameter over 'data' (and gathers it just before use)")
    mesh = _mesh((8,), ("data",))
    shard = NamedSharding(mesh, spec).shard_shape((512, 2048))
    if math.prod(shard) * 8 != 512 * 2048:
        _fail(f"each device holds a {shard} block, not 1/8 of the kernel")
    if hidden:
        w = jnp.asarray(np.random.default_rng(0).normal(size=(512, 2048)), jnp.float32)
        x = jnp.ones((16, 512), jnp.float32)
        placed = jax.device_put(w, NamedSharding(mesh, spec))
        if not _close(jax.jit(jnp.matmul)(x, placed), x @ w, rtol=1e-4, atol=1e-3):
            _fail("a forward pass with your layout differs from the unsharded one")
    return f"{spec}: each device holds 1/8 of the kernel, {shard}"


@_exercise("09c_fsdp_and_tensor_parallelism")
def verify_megatron_specs(specs, hidden=False):
    """``specs = (w1_spec, w2_spec)``: PartitionSpecs of the MLP y = gelu(x @ W1) @ W2, W1 of
    shape (d, 4d) and W2 of shape (4d, d), for Megatron tensor parallelism over a mesh axis
    'model': one all-reduce per MLP, none between the two layers."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    specs = _value(specs, "pair of PartitionSpecs")
    if not isinstance(specs, (tuple, list)) or len(specs) != 2:
        _fail("give two PartitionSpecs, (w1_spec, w2_spec)")
    w1, w2 = (_as_spec(s, n) for s, n in zip(specs, ("w1_spec", "w2_spec")))
    for s, n in ((w1, "w1_spec"), (w2, "w2_spec")):
        if [a for a in _spec_axes(s) if a != "model"]:
            _fail(f"{n} = {s}: this mesh has one axis, 'model'")
        if len(s) > 2:
            _fail(f"{n} = {s} has {len(s)} entries for a 2-D weight")

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
        _fail("W1 split along its input features gives each device a partial sum of the "
              "hidden layer before the nonlinearity (gelu(a + b) != gelu(a) + gelu(b)): split "
              "W1's columns, its output features")
    if split(w2, 1):
        _fail("W2 split along its output features needs the whole hidden activation on every "
              "device, an all-gather between the layers: split W2's rows, its input features, "
              "so each device uses its own hidden units")
    if hidden:
        mesh = _mesh((8,), ("model",))
        rng = np.random.default_rng(3)
        x = jnp.asarray(rng.normal(size=(4, 16)), jnp.float32)
        a = jnp.asarray(rng.normal(size=(16, 64)), jnp.float32)
        b = jnp.asarray(rng.normal(size=(64, 16)), jnp.float32)
        mlp = jax.jit(lambda x, a, b: jax.nn.gelu(x @ a) @ b)
        got = mlp(x, jax.device_put(a, NamedSharding(mesh, w1)),
                  jax.device_put(b, NamedSharding(mesh, w2)))
        if not _close(got, mlp(x, a, b), rtol=1e-3, atol=1e-3):
            _fail("the MLP with your layout differs from the unsharded one")
    return "W1 split by columns, W2 by rows: one all-reduce after W2"


# --------------------------------------------------------------------------------------------
# 09d: pipeline parallelism

@_exercise("09d_pipeline_parallelism")
def verify_gpipe_bubble(bubble, hidden=False):
    """``bubble(p, m)``: the fraction of a GPipe schedule each of p stages is idle with m
    micro-batches."""
    cases = [(4, 8), (8, 32), (2, 1)] + ([(1, 5), (16, 3), (6, 100)] if hidden else [])
    for p, m in cases:
        got = _number(_call(bubble, "bubble", p, m), "bubble")
        want = (p - 1) / (m + p - 1)
        if _close(got, want, rtol=1e-9, atol=1e-12):
            continue
        if _close(got, (p - 1) / m):
            _fail("that is the idle time relative to the useful work; the fraction of the "
                  "schedule divides by the schedule's whole length")
        if _close(got, p / (m + p)) or _close(got, p / (m + p - 1)) or _close(
                got, (p - 1) / (m + p)):
            _fail(f"off by one (p={p}, m={m}): count the schedule's slots again: when does "
                  f"the last stage start, and when does the first one finish?")
        if not 0 <= got < 1:
            _fail(f"{got:g} is not a fraction of the time")
        _fail(f"for p={p} stages and m={m} micro-batches you give {got:.4g}")
    return "(p - 1) / (m + p - 1)"


@_exercise("09d_pipeline_parallelism")
def verify_1f1b(one_f_one_b, hidden=False):
    """``one_f_one_b(p, m)`` -> (idle fraction of each stage, the most micro-batches whose
    activations the first stage holds at once) for the 1F1B schedule."""
    cases = [(4, 8), (8, 32), (4, 2)] + ([(1, 4), (16, 64), (3, 3)] if hidden else [])
    for p, m in cases:
        out = _call(one_f_one_b, "one_f_one_b", p, m)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            _fail("return two numbers: (idle fraction, micro-batches in flight)")
        bubble = _number(out[0], "one_f_one_b")
        held = _number(out[1], "one_f_one_b")
        want = (p - 1) / (m + p - 1)
        if bubble < want * (1 - 1e-9):
            _fail("1F1B does not shrink the bubble: it idles as much as GPipe; what it saves "
                  "is memory")
        if not _close(bubble, want, rtol=1e-9):
            _fail(f"the idle fraction for p={p}, m={m} is wrong: 1F1B idles as much as GPipe")
        if held == m and m > p:
            _fail(f"{m} micro-batches held is GPipe: in 1F1B the first stage starts a "
                  f"backward pass as soon as the first micro-batch returns, so it holds at "
                  f"most p")
        if held == p and m < p:
            _fail(f"with m={m} micro-batches for p={p} stages, no stage can hold more than m")
        if held != min(p, m):
            _fail(f"the first stage holds {held:g} micro-batches at once for p={p}, m={m}: "
                  f"count the forwards it runs before its first backward")
    return "the same bubble as GPipe, at most min(p, m) micro-batches in flight"


# --------------------------------------------------------------------------------------------
# 09e: overlapping communication

def _bucketed(backward, comm, b):
    done = 0.0
    for i in range(b):  # bucket i is ready at (i+1)/b of the backward pass; one link
        done = max(done, (i + 1) * backward / b) + comm / b
    return done


@_exercise("09e_overlapping_communication")
def verify_overlapped_step(step_time, hidden=False):
    """``step_time(backward, comm, num_buckets)``: seconds until the last gradient is
    all-reduced when the backward pass (``backward`` seconds) produces the gradient in
    ``num_buckets`` equal buckets, each all-reduced (``comm`` / ``num_buckets`` seconds, one at
    a time) as soon as it is ready."""
    cases = [(1.0, 0.4, 4), (1.0, 2.0, 4), (0.3, 0.3, 1)]
    if hidden:
        cases += [(2.0, 0.5, 10), (0.5, 3.0, 8), (1.0, 1.0, 3)]
    for t_b, t_c, b in cases:
        got = _number(_call(step_time, "step_time", t_b, t_c, b), "step_time")
        want = _bucketed(t_b, t_c, b)
        if _close(got, want, rtol=1e-9):
            continue
        if _close(got, max(t_b, t_c)):
            _fail("perfect overlap is impossible: the last bucket's all-reduce can start only "
                  "when the backward pass has produced it")
        if _close(got, t_b + t_c):
            _fail("that is no overlap at all: each bucket's all-reduce starts as soon as the "
                  "backward pass has produced it")
        if _close(got, t_b + t_c / b):
            _fail(f"for backward={t_b:g} s, comm={t_c:g} s the link is the bottleneck: the "
                  f"all-reduces queue up behind each other; when can the first one start?")
        _fail(f"for backward={t_b:g} s, comm={t_c:g} s, {b} buckets you give {got:.4g} s")
    return "the last bucket's all-reduce after the backward pass, or the link's queue"


# --------------------------------------------------------------------------------------------
# 10a: checkpoints

@_exercise("10a_checkpoints")
def verify_restore_target(restore_target, hidden=False):
    """``restore_target(tree, mesh, specs)``: the target to restore ``tree`` onto ``mesh``: for
    each array, its shape, dtype and a NamedSharding on ``mesh`` by its spec -- no data."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec as P
    saved_mesh = _mesh((8,), ("data",))
    tree = {"w": jnp.zeros((8, 4), jnp.float32), "b": jnp.zeros(4, jnp.bfloat16),
            "step": jnp.zeros((), jnp.int32)}
    tree = jax.device_put(tree, {"w": NamedSharding(saved_mesh, P("data")),
                                 "b": NamedSharding(saved_mesh, P()),
                                 "step": NamedSharding(saved_mesh, P())})
    specs = {"w": P(None, "data"), "b": P(), "step": P()}
    for k in [4] + ([2] if hidden else []):
        mesh = _mesh((k,), ("data",))
        target = _call(restore_target, "restore_target", tree, mesh, specs)
        if jax.tree.structure(target) != jax.tree.structure(tree):
            _fail("the target should have the structure of the saved tree")
        for name in tree:
            t, a = target[name], tree[name]
            if isinstance(t, jax.Array):
                _fail("you returned arrays: a target only describes each array "
                      "(jax.ShapeDtypeStruct: shape, dtype, sharding); allocating them first "
                      "costs the memory twice")
            if not isinstance(t, jax.ShapeDtypeStruct):
                _fail(f"'{name}' is a {type(t).__name__}: describe it with "
                      f"jax.ShapeDtypeStruct(shape, dtype, sharding=...)")
            if t.shape != a.shape or t.dtype != a.dtype:
                _fail(f"'{name}' is {t.dtype}{list(t.shape)} in your target but "
                      f"{a.dtype}{list(a.shape)} in the checkpoint: keep shape and dtype")
            if t.sharding is None:
                _fail(f"'{name}' has no sharding: Orbax would not know where to put it; give "
                      f"it a NamedSharding on the new mesh")
            if t.sharding.mesh.devices.size != k:
                _fail(f"'{name}' is laid out on the {t.sharding.mesh.devices.size}-device mesh "
                      f"it was saved from, not the {k}-device mesh you restore on")
            if not t.sharding.is_equivalent_to(NamedSharding(mesh, specs[name]), a.ndim):
                _fail(f"'{name}' is not laid out by its spec {specs[name]} on the new mesh")
    return "shapes, dtypes and the new mesh's shardings, no data"


# --------------------------------------------------------------------------------------------
# 10b: input pipelines

@_exercise("10b_input_pipelines")
def verify_exact_resume(save_position, resume, hidden=False):
    """``save_position(iterator)`` returns what goes into the checkpoint; ``resume(make_iterator,
    saved)`` returns an iterator that continues exactly where the saved one stood."""
    import grain
    import pickle

    def make(seed=0):
        dataset = grain.MapDataset.range(64).shuffle(seed=seed).batch(4)
        return iter(dataset.to_iter_dataset(grain.ReadOptions(num_threads=0)))
    for taken in [3] + ([0, 11] if hidden else []):
        it = make()
        for _ in range(taken):
            next(it)
        saved = _call(save_position, "save_position", it)
        if saved is it:
            _fail("you saved the iterator itself: a checkpoint needs its state "
                  "(get_state()), which can be written to disk")
        try:
            saved = pickle.loads(pickle.dumps(saved))
        except Exception as e:
            _fail(f"what you save cannot be written to disk ({type(e).__name__}): save the "
                  f"iterator's state")
        expected = [np.asarray(next(it)).tolist() for _ in range(2)]
        resumed = _call(resume, "resume", make, saved)
        try:
            got = [np.asarray(next(resumed)).tolist() for _ in range(2)]
        except Exception as e:
            _fail(f"the resumed iterator failed: {type(e).__name__}: {_first_line(e)}")
        if got == expected:
            continue
        fresh = make()
        first = [np.asarray(next(fresh)).tolist() for _ in range(2)]
        if got == first and taken:
            _fail(f"your resumed iterator starts from the beginning: the run would see the "
                  f"first {taken} batches twice; restore the saved state (set_state)")
        _fail("the batches after resuming differ from those the run would have seen next")
    return "the same batches after restoring as without stopping"


# --------------------------------------------------------------------------------------------
# 11a: several processes

def _rows(value, name):
    if isinstance(value, slice):
        value = range(*value.indices(10**9))
    try:
        return [int(i) for i in np.asarray(list(value)).ravel()]
    except Exception:
        _fail(f"`{name}` should return row indices (a range, slice or array), got "
              f"{type(value).__name__}")


@_exercise("11a_multi_process")
def verify_process_rows(process_rows, hidden=False):
    """``process_rows(batch_size, num_processes, process_index)``: the rows of a global batch
    this process loads, so that the global array assembled over the mesh (processes in order)
    is the batch."""
    cases = [(256, 2, 0), (256, 2, 1), (96, 4, 3)]
    if hidden:
        cases += [(8, 8, 5), (60, 3, 1), (32, 1, 0)]
    for b, n, p in cases:
        got = _rows(_call(process_rows, "process_rows", b, n, p), "process_rows")
        local = b // n
        want = list(range(p * local, (p + 1) * local))
        if got == want:
            continue
        if len(got) != local:
            _fail(f"process {p} of {n} loads {len(got)} rows of a batch of {b}: each loads "
                  f"b / num_processes = {local}")
        if got == list(range(p, b, n)):
            _fail("every num_processes-th row is interleaved: process p must load one "
                  "contiguous block, because the global array's rows follow the devices in "
                  "mesh order, process 0's first")
        if got and (got[0] == (p + 1) * local or got[0] == p * local + 1):
            _fail(f"off by one: process {p}'s block starts at row {got[0]}; process 0's "
                  f"starts at row 0")
        _fail(f"process {p} of {n} loads rows {got[:3]}... of a batch of {b}")
    return "one contiguous block per process, in process order"


# --------------------------------------------------------------------------------------------
# 11b: failures and clusters

@_exercise("11b_failures_and_clusters")
def verify_checkpoint_interval(checkpoint_interval, hidden=False):
    """``checkpoint_interval(save_seconds, device_mtbf_seconds, num_devices)``: Young's
    optimal time between checkpoints for a job on ``num_devices`` devices that each fail on
    average once in ``device_mtbf_seconds``."""
    year = 365 * 24 * 3600
    cases = [(120, 5 * year, 1000), (30, year, 64), (600, 2 * year, 1)]
    if hidden:
        cases += [(5, 10 * year, 10**4), (60, 0.5 * year, 8)]
    for c, mtbf, n in cases:
        got = _number(_call(checkpoint_interval, "checkpoint_interval", c, mtbf, n),
                      "checkpoint_interval")
        job = mtbf / n
        want = math.sqrt(2 * c * job)
        if _close(got, want, rtol=1e-6):
            continue
        if n > 1 and _close(got, math.sqrt(2 * c * mtbf)):
            _fail(f"with {n} devices the job fails {n} times as often as one device: its "
                  f"mean time between failures is the device's divided by {n}")
        if _close(got, want / math.sqrt(2)):
            _fail("\u221a2 too small: Young's interval balances the time spent saving "
                  "against the expected work lost, half an interval per failure")
        if _close(got, want ** 2):
            _fail("that is in seconds squared: take the square root")
        _fail(f"{_times(got, want)} for {n} devices")
    return "Young's sqrt(2 \u00d7 save time \u00d7 the job's MTBF)"

