"""The checks of the exercises of notebook 09a_memory."""
import math

from ._common import _call, _close, _exercise, _fail, _number, _observe, _times

# --------------------------------------------------------------------------------------------
# 09a: memory per device

_SPLIT = {  # what each strategy splits over the k devices
    "dp": {"activations"},                                    # the batch
    "fsdp": {"parameters", "gradients", "optimizer state", "activations"},
    "tp": {"parameters", "gradients", "optimizer state"},     # every weight, not the batch
}


def _device_bytes(num_params, activation_bytes, k, strategy):
    """The bytes device 0 holds: the float32 parameters, their gradient and the state optax's
    Adam keeps for them (shapes only, nothing allocated), and the activations; an array a
    strategy splits is cut into k pieces, the first of which device 0 holds."""
    import jax
    import jax.numpy as jnp
    import optax
    params = jax.ShapeDtypeStruct((num_params,), jnp.float32)
    state = jax.eval_shape(optax.adam(1e-3).init, params)
    held = {"parameters": [params], "gradients": [params],
            "optimizer state": [s for s in jax.tree.leaves(state) if s.shape == params.shape],
            "activations": [jax.ShapeDtypeStruct((activation_bytes,), jnp.uint8)]}
    total = 0
    for what, arrays in held.items():
        for a in arrays:
            size = math.prod(a.shape)
            piece = -(-size // k) if what in _SPLIT[strategy] else size
            total += piece * a.dtype.itemsize
    return total


@_exercise("09a_memory", cases=[(10**9, 4 * 10**9, 8), (10**6, 10**8, 4)],
           passed="what device 0 holds when each strategy splits its arrays")
def training_memory(bytes_per_device, case):
    """``bytes_per_device(num_params, activation_bytes, k, strategy)``: bytes each of k devices
    holds to train with Adam in float32 (parameters, gradients, two moments, activations) under
    strategy 'dp', 'fsdp' or 'tp' (tensor parallelism splits every weight, not the batch)."""
    P_, A, k = case
    got = _observe(lambda: {s: _number(_call(bytes_per_device, "bytes_per_device", P_, A, k, s),
                                       "bytes_per_device") for s in ("dp", "fsdp", "tp")})
    want = {s: _device_bytes(P_, A, k, s) for s in ("dp", "fsdp", "tp")}
    for strategy in ("dp", "fsdp", "tp"):
        g, w = got[strategy], want[strategy]
        if _close(g, w, rtol=1e-9):
            continue
        activations = A / k if "activations" in _SPLIT[strategy] else A
        per = (g - activations) / (P_ / (k if "parameters" in _SPLIT[strategy] else 1))
        if _close(per, 8):
            _fail(f"{strategy}: you left out Adam's two moments; with the parameters and "
                  f"gradients that is four float32 values, 16 bytes per parameter")
        if _close(per, 12) or _close(per, 4):
            _fail(f"{strategy}: count four float32 values per parameter (parameter, gradient, "
                  f"Adam's two moments), 16 bytes")
        if strategy == "fsdp" and _close(g, want["dp"]):
            _fail("fsdp: FSDP splits the parameters, gradients and optimizer state over the k "
                  "devices; here every device holds all of them")
        if strategy == "fsdp" and _close(g, 4 * P_ / k + 12 * P_ + A / k):
            _fail("fsdp: you split only the parameters; FSDP splits the gradients and the "
                  "optimizer state too")
        if strategy == "tp" and _close(g, want["fsdp"]):
            _fail("tp: tensor parallelism does not split the batch: every device computes on "
                  "every example, so it holds all the activations")
        if strategy == "dp" and _close(g, want["dp"] - A / k + A):
            _fail("dp: each device computes on 1/k of the batch, so it holds 1/k of the "
                  "activations")
        if A and _close(g, w - activations):
            _fail(f"{strategy}: add the activations")
        _fail(f"{strategy}: {_times(g, w)} for {P_:g} parameters on {k} devices")
