"""The checks of the exercises of notebook 07c_mixed_precision."""
import numpy as np

from ._common import _call, _close, _exercise, _fail, _observe, _times

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
