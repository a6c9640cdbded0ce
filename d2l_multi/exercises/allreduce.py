"""The checks of the exercises of notebook 02_allreduce."""
import numpy as np

from ._common import (
    _call,
    _close,
    _exercise,
    _fail,
    _mesh,
    _number,
    _Problem,
    _run,
    _shown_name,
    _times,
)

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
def broadcast(broadcast, hidden=False):
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
def reduce_scatter(reduce_scatter, hidden=False):
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
def all_gather(all_gather, hidden=False):
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
def ring_allreduce(allreduce, hidden=False):
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
def ring_bytes(bytes_sent, hidden=False):
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
