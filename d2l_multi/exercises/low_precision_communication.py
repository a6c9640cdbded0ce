"""The checks of the exercises of notebook 07d_low_precision_communication."""
import numpy as np

from ._common import _call, _equations, _exercise, _fail, _mesh, _observe, _run

# --------------------------------------------------------------------------------------------
# 07d: low-precision communication


def _bf16():
    import ml_dtypes
    return np.dtype(ml_dtypes.bfloat16)


def _parts(seed, k, n):
    """k devices' shares of a gradient-like sum, in bfloat16: entries from 1e-4 to 1e-2."""
    rng = np.random.default_rng(seed)
    base = rng.normal(size=n) * 10.0 ** rng.uniform(-4, -2, n)
    return [((base + 2 * np.abs(base) * rng.normal(size=n)) / k).astype(np.float32)
            .astype(_bf16()) for _ in range(k)]


def _error(total, parts):
    exact = sum(p.astype(np.float64) for p in parts)
    return float(np.linalg.norm(np.asarray(total, np.float64) - exact) / np.linalg.norm(exact))


def _ring(parts):
    """The ring the exercise asks for: each hop adds in float32 and sends bfloat16."""
    total = parts[0]
    for p in parts[1:]:
        total = (total.astype(np.float32) + p.astype(np.float32)).astype(_bf16())
    return total


def _rings(parts):
    """The sums of every ring through the k devices: each start, either direction."""
    k = len(parts)
    for start in range(k):
        for step in (1, -1):
            yield _ring([parts[(start + step * i) % k] for i in range(k)]).astype(np.float64)


def _off_ring(got, ring):
    """The fraction of ``got``'s entries more than one bfloat16 step (ulp) from ``ring``'s:
    a last addition left unrounded is within half a step."""
    ulp = 2.0 ** (np.floor(np.log2(np.maximum(np.abs(ring), 2.0 ** -126))) - 7)
    return float(np.mean(np.abs(got - ring) > ulp))


@_exercise("07d_low_precision_communication", cases=[(0, 16)],
           passed="a running sum rounded to bfloat16 at every hop, added in float32")
def ring_sum(ring_sum, case):
    """``ring_sum(parts)``: the sum of ``parts`` (one bfloat16 array per device) as a ring
    makes it, passing a running sum from device to device: each hop adds its part in float32
    and sends the sum on in bfloat16. Judged entry by entry against every ring through the
    parts (each start, either direction), within one bfloat16 step."""
    seed, k = case
    parts = _parts(seed, k, 4096)

    def probe():
        import jax.numpy as jnp
        total = _call(ring_sum, "ring_sum", [jnp.asarray(p) for p in parts])
        return np.asarray(jnp.asarray(total, jnp.float32))
    got = np.asarray(_observe(probe), np.float64)
    if got.shape != parts[0].shape:
        _fail(f"ring_sum returned shape {list(got.shape)}: return the summed array, of each "
              f"part's shape {list(parts[0].shape)}")
    off = min(_off_ring(got, ring) for ring in _rings(parts))
    if off == 0:
        return
    exact = sum(p.astype(np.float64) for p in parts)
    scale = float(got @ exact / (exact @ exact))
    if abs(scale * k - 1) < 0.05:
        _fail(f"your result is {k}\u00d7 too small: a ring adds the parts; do not divide by the "
              f"{k} devices")
    error, ring = _error(got, parts), _error(_ring(parts), parts)
    once = _error(sum(p.astype(np.float32) for p in parts).astype(_bf16()), parts)
    if error < 0.01 * once:
        _fail(f"your sum is float32's (relative error {error:.1e}): the ring sends every "
              f"running sum in bfloat16; round it before each hop")
    if error < 0.7 * ring and error < 1.3 * once:
        _fail(f"your sum is as precise as one rounding at the end (relative error "
              f"{error:.1e}): in a ring the running sum is rounded to bfloat16 at every hop "
              f"it is sent, not once")
    _fail(f"{off:.0%} of your sums differ from a ring's by more than one bfloat16 rounding "
          f"(relative error {error:.1e}, a ring's {ring:.1e}): add each device's part once, "
          f"in float32, and round the running sum to bfloat16 before each hop")


_COLLECTIVES = ("psum", "psum_invariant", "reduce_scatter", "all_gather",
                "all_gather_invariant", "ppermute", "all_to_all")


def _collectives(jaxpr):
    """Each collective of the program: (primitive, dtype of its operand, its local size)."""
    return [(eqn.primitive.name, str(v.aval.dtype), int(np.prod(v.aval.shape)))
            for eqn in _equations(jaxpr) if eqn.primitive.name in _COLLECTIVES
            for v in eqn.invars]


def _ring_bytes(name, dtype, size, k):
    """Bytes one device sends for the collective on a ring of k devices."""
    item = np.dtype(_bf16() if dtype == "bfloat16" else dtype).itemsize
    return {"psum": 2 * (k - 1) / k * size, "psum_invariant": 2 * (k - 1) / k * size,
            "reduce_scatter": (k - 1) / k * size, "all_gather": (k - 1) * size,
            "all_gather_invariant": (k - 1) * size, "ppermute": size,
            "all_to_all": (k - 1) / k * size}[name] * item


@_exercise("07d_low_precision_communication", cases=[(0, 8, 2048)],
           passed="a float32 reduce-scatter, a bfloat16 all-gather: three quarters of the "
                  "bytes, one rounding")
def bf16_gather(allreduce_bf16_gather, case):
    """``allreduce_bf16_gather(x, axis_name)``, per device under ``shard_map``: the sum of
    every device's bfloat16 ``x``, by a reduce-scatter in float32, then an all-gather in
    bfloat16. A phase written by hand (``lax.ppermute``, ``lax.all_to_all``) is judged by its
    messages in program order: float32 running sums, then bfloat16 finished sums."""
    seed, k, n = case
    parts = _parts(seed, k, n)

    def probe():
        import jax
        import jax.numpy as jnp
        from jax.sharding import PartitionSpec as P
        mesh = _mesh((k,), ("data",))

        def local(block):
            out = _call(allreduce_bf16_gather, "allreduce_bf16_gather", block[0], "data")
            return jnp.asarray(out, jnp.float32)[None]
        program = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P("data"),
                                        out_specs=P("data"), check_vma=False))
        x = jnp.asarray(np.stack(parts))
        traced = _run(program.trace, x, name="allreduce_bf16_gather")
        out = _run(traced.lower().compile(), x, name="allreduce_bf16_gather")
        return {"out": np.asarray(out), "collectives": _collectives(traced.jaxpr.jaxpr)}
    seen = _observe(probe)
    used = [tuple(c) for c in seen["collectives"]]
    names = {name for name, _, _ in used}
    if any(name.startswith("psum") and dtype == "bfloat16" for name, dtype, _ in used):
        _fail("you psum in bfloat16: the ring's running sums lose precision at every hop; "
              "reduce-scatter in float32 (lax.psum_scatter), then all-gather in bfloat16")
    if names & {"psum", "psum_invariant"}:
        _fail("a psum sends float32 in both of its phases: full bytes; split it into "
              "lax.psum_scatter in float32 and lax.all_gather in bfloat16")
    scatter = [dtype for name, dtype, _ in used if name == "reduce_scatter"]
    gather = [dtype for name, dtype, _ in used if name.startswith("all_gather")]
    by_hand = [name for name, _, _ in used if name in ("ppermute", "all_to_all")]
    if (not scatter or not gather) and not by_hand:
        _fail("use one lax.psum_scatter (the reduce-scatter) and one lax.all_gather")
    if not (scatter and gather):  # a phase written by hand: its messages, in order
        sent = [dtype for _, dtype, _ in used]
        cut = sent.index("bfloat16") if "bfloat16" in sent else len(sent) - 1
        scatter, gather = sent[:cut] or sent[:1], sent[cut:]
        if "bfloat16" in gather[:1] and "float32" in gather:
            _fail("you send float32 messages after bfloat16 ones: the reduce-scatter's "
                  "running sums first, in float32, then the all-gather's finished sums, "
                  "in bfloat16")
    if "bfloat16" in scatter and "float32" in gather:
        _fail("the wrong way round: the reduce-scatter's messages are running sums (keep "
              "them float32), the all-gather's finished sums (send them in bfloat16)")
    if "bfloat16" in scatter:
        _fail("your reduce-scatter sends bfloat16: its messages are running sums, which "
              "lose precision at every hop; keep them float32")
    if "bfloat16" not in gather:
        _fail(f"your all-gather sends {gather[0]}: cast the finished chunk to bfloat16 "
              f"before gathering it")
    sent = sum(_ring_bytes(name, dtype, size, k) for name, dtype, size in used)
    full = _ring_bytes("psum", "float32", n, k)
    if abs(sent / full - 0.75) > 0.01:
        _fail(f"your collectives send {sent / full:.2f} of a float32 allreduce's bytes, not "
              f"3/4: a float32 reduce-scatter and a bfloat16 all-gather of the whole array")
    out = np.asarray(seen["out"], np.float64)
    if out.shape != (k, n):
        _fail(f"each device should end with the whole sum, shape ({n},): all-gather with "
              f"tiled=True")
    error = max(_error(row, parts) for row in out)
    if error > 2.0 ** -8:
        _fail(f"the sum's relative error is {error:.1e}, above bfloat16's one rounding "
              f"(2^-8): add every device's x once, in float32")
