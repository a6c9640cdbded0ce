"""The checks of the exercises of notebook 07c_mixed_precision."""
import numpy as np

from ._common import _call, _close, _exercise, _fail, _number, _observe, _times

# --------------------------------------------------------------------------------------------
# 07c: mixed precision


@_exercise("07c_mixed_precision", cases=[(0.1, 1e-3, 100)],
           passed="float32 master weights keep the small updates bfloat16 would lose")
def master_weights(mixed_step, case):
    """``mixed_step(master, grads, lr)``: one SGD step with float32 master weights and
    bfloat16 gradients; returns (new float32 master weights, their bfloat16 copy for the next
    forward pass)."""
    lr, g, steps = case

    def probe():
        import jax.numpy as jnp
        master, copy = jnp.ones(4, jnp.float32), None
        grads = jnp.full(4, g, jnp.bfloat16)
        for _ in range(steps):
            out = _call(mixed_step, "mixed_step", master, grads, lr)
            if not isinstance(out, (tuple, list)) or len(out) != 2:
                return {"returned": type(out).__name__}
            master, copy = out
            if jnp.asarray(master).dtype != jnp.float32:
                return {"master_dtype": str(jnp.asarray(master).dtype)}
        return {"master": np.asarray(master), "copy": np.asarray(jnp.asarray(copy)),
                "copy_dtype": str(jnp.asarray(copy).dtype)}
    seen = _observe(probe)
    if "returned" in seen:
        _fail("return two arrays: (float32 master weights, bfloat16 copy)")
    if "master_dtype" in seen:
        _fail(f"your master weights are {seen['master_dtype']}: keep them float32 and cast only "
              f"the copy for the forward pass")
    import ml_dtypes
    g16 = float(np.asarray(g, ml_dtypes.bfloat16))  # the gradient as bfloat16 holds it
    master = np.ones(4, np.float32)                  # float32 master weights, step by step
    for _ in range(steps):
        master = (master - np.float32(lr) * np.float32(g16)).astype(np.float32)
    got = np.asarray(seen["master"], np.float64)
    if _close(got, 1.0):
        _fail(f"after {steps} steps of lr \u00d7 g = {lr * g:g} your weights have not moved: in "
              f"bfloat16, 1.0 - {lr * g:g} rounds back to 1.0 (lost updates); apply the update "
              f"to the float32 master weights")
    if not _close(got, master, rtol=1e-4):
        _fail(f"after {steps} steps your master weights are {float(got[0]):.6f}, "
              f"{_times(1 - float(got[0]), 1 - float(master[0]))} a change")
    if seen["copy_dtype"] != "bfloat16":
        _fail(f"the copy for the forward pass is {seen['copy_dtype']}: make it bfloat16")
    rounded = np.asarray(seen["master"]).astype(ml_dtypes.bfloat16).astype(np.float64)
    if not _close(np.asarray(seen["copy"], np.float64), rounded):
        _fail("the bfloat16 copy is not the master weights rounded to bfloat16")


def _lost_problem(seed):
    """Weights near 1 and gradients from 1e-9 to 1e-1 in magnitude, some of them zero."""
    rng = np.random.default_rng(seed)
    params = [rng.normal(1.0, 0.5, size=(40, 25)).astype(np.float32),
              rng.normal(0.0, 0.1, size=500).astype(np.float32)]
    grads = [(rng.choice([-1, 1], size=p.shape) * 10.0 ** rng.uniform(-9, -1, p.shape)
              * (rng.random(p.shape) > 0.05)).astype(np.float32) for p in params]
    return params, grads


def _count_lost(params, grads, lr, dtype, mistake=None):
    """The nonzero gradients whose SGD update leaves the weight, stored in dtype, unchanged
    (an update that underflows to zero in dtype is lost too); or a plausible wrong count."""
    import ml_dtypes
    dt = np.dtype(ml_dtypes.bfloat16) if dtype == "bfloat16" else np.dtype(dtype)
    p = np.concatenate([np.ravel(a) for a in params])
    g = np.concatenate([np.ravel(a) for a in grads])
    if mistake == "gradient cast":  # small gradients round to 0 in dtype: not counted
        g = g.astype(dt)
    u = (np.float32(-lr) * g.astype(np.float32)).astype(np.float32)
    if mistake != "float32":
        p, u = p.astype(dt), u.astype(dt)
    same = (p + u).astype(p.dtype) == p
    if mistake == "zeros":
        return int(np.sum(same))
    if mistake == "underflow":
        return int(np.sum(same & (u != 0)))
    return int(np.sum(same & (g != 0)))


@_exercise("07c_mixed_precision", cases=[(0, 0.1)],
           passed="lost updates counted in float16 and bfloat16, underflow included")
def lost_updates(count_lost, case):
    """``count_lost(params, grads, lr, dtype)``: how many nonzero gradients of an SGD step
    with rate ``lr`` leave their weight unchanged when weights and updates are stored in
    ``dtype`` (float16 or bfloat16)."""
    seed, lr = case
    params, grads = _lost_problem(seed)

    def probe():
        import jax.numpy as jnp
        return {name: _number(_call(count_lost, "count_lost", params, grads, lr, dtype),
                              "count_lost")
                for name, dtype in (("float16", jnp.float16), ("bfloat16", jnp.bfloat16))}
    seen = _observe(probe)

    def near(got, want):  # a tie rounded another way here and there
        return abs(got - want) <= max(2, 0.002 * want)
    for dtype in ("float16", "bfloat16"):
        got, want = seen[dtype], _count_lost(params, grads, lr, dtype)
        if near(got, want):
            continue
        if near(got, _count_lost(params, grads, lr, dtype, "float32")):
            _fail(f"your {dtype} count is float32's: cast the weights and the updates to "
                  f"{dtype} before adding them")
        if near(got, _count_lost(params, grads, lr, dtype, "zeros")):
            _fail("you counted zero gradients as lost: a zero gradient asks for no update; "
                  "count only the nonzero ones")
        if near(got, _count_lost(params, grads, lr, dtype, "underflow")):
            _fail(f"you missed the updates that underflow: lr \u00d7 g below {dtype}'s "
                  f"smallest number rounds to 0 and is lost too; test the gradient, not the "
                  f"rounded update, for zero")
        if near(got, _count_lost(params, grads, lr, dtype, "gradient cast")):
            _fail(f"you cast the gradient to {dtype} before testing it for zero: its "
                  f"smallest entries round to 0 there and drop out of your count; test the "
                  f"float32 gradient for zero")
        _fail(f"you count {got:g} lost updates in {dtype}, not {want}: a lost update is a "
              f"nonzero gradient whose weight w + (-lr \u00d7 g), in {dtype}, equals w")
