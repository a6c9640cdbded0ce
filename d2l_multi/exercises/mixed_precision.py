"""The checks of the exercises of notebook 07c_mixed_precision."""
from ._common import _call, _close, _exercise, _fail, _times

# --------------------------------------------------------------------------------------------
# 07c: mixed precision

@_exercise("07c_mixed_precision")
def master_weights(mixed_step, hidden=False):
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
