"""The checks of the exercises of notebook 02_allreduce."""
import math

import numpy as np

from ._common import (
    _call,
    _close,
    _equations,
    _exercise,
    _fail,
    _mesh,
    _observe,
    _Problem,
    _run,
    _shown_name,
    _sub_jaxprs,
)

# --------------------------------------------------------------------------------------------
# 02: allreduce

_COLLECTIVES = {"psum", "all_gather", "reduce_scatter", "all_to_all", "pmax", "pmin",
                "psum_invariant", "pbroadcast", "all_gather_invariant", "psum_scatter"}


def _primitives(jaxpr):
    return {eqn.primitive.name for eqn in _equations(jaxpr)}


def _ppermutes(jaxpr):
    """How many ppermutes the program runs one after another (a scan's body counts its
    length times; None when a while loop hides the number)."""
    count = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "ppermute":
            count += 1
        inner = [_ppermutes(sub) for sub in _sub_jaxprs(eqn)]
        if not inner:
            continue
        if None in inner or (eqn.primitive.name == "while" and any(inner)):
            return None
        if eqn.primitive.name == "scan":
            count += eqn.params["length"] * sum(inner)
        elif eqn.primitive.name == "cond":
            count += max(inner)
        else:
            count += sum(inner)
    return count


def _per_device(fn, name, x, k):
    """Run ``fn(local, 'data')`` with ``shard_map`` on k devices, ``x`` stacking the k local
    inputs along axis 0: (the stacked results, the collectives the program uses, how many
    ppermutes it runs)."""
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
    jaxpr = traced.jaxpr.jaxpr
    return (np.asarray(out, np.float64), sorted(_primitives(jaxpr) & _COLLECTIVES),
            _ppermutes(jaxpr))


def _only_ppermute(used, fn, name):
    if used:
        _fail(f"`{_shown_name(fn, name)}` uses {', '.join(used)}: write it with lax.ppermute "
              f"alone (plus lax.axis_index and arithmetic)")


def _bits(k, width):
    """Device d holds 2**d everywhere: a sum names who contributed (bit d set = device d's
    value was added)."""
    return np.broadcast_to(2.0 ** np.arange(k)[:, None], (k, width)).astype(np.float32)


def _contributors(out_bits, k):
    """The fewest devices any value of ``out_bits`` adds up, or None if they are not sums of
    distinct devices' bits."""
    full = 2 ** k - 1
    counts = {bin(int(v)).count("1") for v in np.ravel(out_bits)
              if float(v).is_integer() and 0 < v <= full}
    return min(counts) if counts else None


@_exercise("02_allreduce", cases=[8], passed="every device holds device 0's value")
def broadcast(broadcast, k):
    """``broadcast(x, axis_name)``, per device: every device ends with device 0's ``x``."""
    x = np.random.default_rng(k).normal(size=(k, 3)).astype(np.float32) + 2
    out = _observe(lambda: _per_device(broadcast, "broadcast", x, k)[0])
    if out.shape != x.shape:
        _fail(f"each device returned shape {out.shape[1:]}: return an array shaped like x")
    if _close(out, np.broadcast_to(x[0], x.shape), rtol=1e-5, atol=1e-6):
        return
    if _close(out, np.broadcast_to(x.sum(0), x.shape), rtol=1e-5):
        _fail(f"every device holds the sum of all {k} values, not device 0's: zero out the "
              f"other devices' values before the psum")
    if _close(out, np.broadcast_to(x[0] / k, x.shape), rtol=1e-5):
        _fail(f"every device holds 1/{k} of device 0's value: psum (a sum) of one nonzero "
              f"value is that value; pmean divides by {k}")
    if _close(out, x, rtol=1e-6):
        _fail("each device kept its own value: nothing was communicated")
    if _close(out, np.broadcast_to(x[-1], x.shape), rtol=1e-5):
        _fail("every device holds the last device's value: broadcast device 0's")
    _fail("the devices do not all hold device 0's value")


def _ring_probe(fn, name, k, width, seed):
    """What a ring check observes: the results on random blocks and on the bits blocks, the
    collectives used and the number of ppermutes."""
    x = np.random.default_rng(seed).normal(size=(k, width)).astype(np.float32)

    def probe():
        out, used, steps = _per_device(fn, name, x, k)
        out_bits = _per_device(fn, name, _bits(k, width), k)[0] if not used else None
        return {"out": out, "used": used, "steps": steps, "bits": out_bits}
    return x, _observe(probe)


@_exercise("02_allreduce", cases=[(8, 2)],
           passed="device i holds the sum of chunk i, from ppermute alone")
def reduce_scatter(reduce_scatter, case):
    """``reduce_scatter(x, axis_name)``, per device, with ``lax.ppermute``: x holds k chunks;
    device i returns the sum over the devices of chunk i."""
    k, c = case
    x, seen = _ring_probe(reduce_scatter, "reduce_scatter", k, k * c, k * 100 + c)
    _only_ppermute(seen["used"], reduce_scatter, "reduce_scatter")
    out = seen["out"]
    if out.shape == (k, k * c):
        _fail(f"each device returned all {k} chunks ({k * c} values): return only chunk i's "
              f"sum, {c} values")
    if out.shape != (k, c):
        _fail(f"each device returned shape {out.shape[1:]}: return chunk i's sum, shape "
              f"({c},)")
    sums = x.reshape(k, k, c).sum(0)  # sums[j] = the sum of chunk j
    if _close(out, sums, rtol=1e-5, atol=1e-5):
        return
    if _close(out, sums / k, rtol=1e-5, atol=1e-5):
        _fail(f"{k}\u00d7 too small: a reduce-scatter sums the chunks, it does not average")
    for s in range(1, k):
        if _close(out, np.roll(sums, -s, axis=0), rtol=1e-5, atol=1e-5):
            _fail(f"device i holds the sum of chunk i+{s} (mod {k}), not chunk i: shift which "
                  f"chunk each device sends first by {s}")
    m, steps = _contributors(seen["bits"], k), seen["steps"]
    if m is not None and m < k:
        if steps is not None and steps < k - 1:
            _fail(f"your ring takes {steps} steps and the sums add up only {m} of the {k} "
                  f"devices' chunks: a ring needs k-1 = {k - 1} steps, each adding one more "
                  f"device's chunk")
        _fail(f"the chunk device i returns adds up only {m} of the {k} devices' values: after "
              f"the k-1 steps one chunk on each device holds the complete sum, the one it "
              f"added last; make that chunk i (which chunk does device i send first?)")
    _fail("device i does not hold the sum over the devices of chunk i")


@_exercise("02_allreduce", cases=[(8, 2)],
           passed="every device holds all chunks in device order, from ppermute alone")
def all_gather(all_gather, case):
    """``all_gather(x, axis_name)``, per device, with ``lax.ppermute``: every device returns
    the k devices' chunks, concatenated in device order."""
    k, c = case
    x = (np.arange(k)[:, None] * 10 + np.arange(c)).astype(np.float32) + 1

    def probe():
        out, used, _ = _per_device(all_gather, "all_gather", x, k)
        return {"out": out, "used": used}
    seen = _observe(probe)
    _only_ppermute(seen["used"], all_gather, "all_gather")
    out = seen["out"]
    if out.shape != (k, k * c):
        _fail(f"each device returned shape {out.shape[1:]}: return the {k} chunks "
              f"concatenated, shape ({k * c},)")
    if _close(out, np.broadcast_to(x.reshape(-1), (k, k * c))):
        return
    blocks = out.reshape(k, k, c)
    if np.any(np.all(blocks == 0, axis=-1)):
        _fail(f"some positions still hold zeros: after k-1 = {k - 1} steps every device has "
              f"received all the other chunks")
    for i in range(k):
        for j in range(k):
            src = [d for d in range(k) if np.array_equal(blocks[i, j], x[d])]
            if src and src[0] != j:
                _fail(f"chunks out of order: position {j} on device {i} holds device "
                      f"{src[0]}'s chunk; put each received chunk at the position of the "
                      f"device it came from")
    _fail("the gathered chunks are not the devices' chunks in device order")


@_exercise("02_allreduce", cases=[(8, 16)],
           passed="every device holds the sum, from ppermute alone")
def ring_allreduce(allreduce, case):
    """``allreduce(x, axis_name)``, per device, with ``lax.ppermute``: every device returns the
    sum of the devices' ``x``, for any length of ``x``."""
    k, n = case
    try:
        x, seen = _ring_probe(allreduce, "allreduce", k, n, n)
    except _Problem as e:
        if n % k:
            _fail(f"fails for an array of {n} values on {k} devices: when the length does not "
                  f"divide into k chunks, pad it ({e})")
        raise
    _only_ppermute(seen["used"], allreduce, "allreduce")
    out = seen["out"]
    if out.shape != (k, n):
        _fail(f"each device returned shape {out.shape[1:]}: return the sum, shaped like x "
              f"({n},)")
    want = np.broadcast_to(x.sum(0), (k, n))
    if _close(out, want, rtol=1e-5, atol=1e-5):
        return
    if _close(out, want / k, rtol=1e-5, atol=1e-5):
        _fail(f"{k}\u00d7 too small: an allreduce sums; averaging is pmean's job")
    full = np.isclose(seen["bits"], 2 ** k - 1)
    if full.any() and not full.all():
        _fail("only some values hold the full sum: after the reduce-scatter, pass the "
              "finished chunks around the ring (the all-gather)")
    m = _contributors(seen["bits"], k)
    if m is not None and m < k:
        _fail(f"the sums add up only {m} of the {k} devices' values: the reduce-scatter needs "
              f"k-1 = {k - 1} steps")
    _fail("the devices do not all hold the sum of the devices' arrays")


@_exercise("02_allreduce", cases=[(8, 6)],
           passed="every device holds the sum after at most log2(k) exchanges")
def few_steps(allreduce, case):
    """``allreduce(x, axis_name)``, per device, with ``lax.ppermute``: every device returns the
    sum of the devices' ``x`` after at most log2(k) ppermutes, k a power of two."""
    k, n = case
    x, seen = _ring_probe(allreduce, "allreduce", k, n, 7 * k + n)
    _only_ppermute(seen["used"], allreduce, "allreduce")
    out, steps, most = seen["out"], seen["steps"], int(math.log2(k))
    if out.shape != (k, n):
        _fail(f"each device returned shape {out.shape[1:]}: return the sum, shaped like x "
              f"({n},)")
    right = _close(out, np.broadcast_to(x.sum(0), (k, n)), rtol=1e-5, atol=1e-5)
    if steps is None:
        _fail("a while loop hides how many steps your allreduce takes: write the steps as a "
              "Python for loop")
    if right and steps <= most:
        return
    m = _contributors(seen["bits"], k)
    if right or (m == k and steps > most):
        _fail(f"your allreduce runs {steps} ppermutes one after another on {k} devices; "
              f"{most} are enough if in every step each device exchanges everything it has "
              f"summed so far with one partner, so the devices it has heard from double")
    if m is not None and m < k:
        _fail(f"after your {steps} steps a device's result adds up only {m} of the {k} "
              f"devices' values: in each step, pair every device with a partner that has "
              f"heard from devices it has not (twice as many each step)")
    if _close(out, np.broadcast_to(x.sum(0) / k, (k, n)), rtol=1e-5, atol=1e-5):
        _fail(f"{k}\u00d7 too small: an allreduce sums; averaging is pmean's job")
    _fail("the devices do not all hold the sum of the devices' arrays")
