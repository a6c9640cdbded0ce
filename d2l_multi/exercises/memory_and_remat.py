"""The checks of the exercises of notebook 09a_memory_and_remat."""
import math

from ._common import _call, _close, _exercise, _fail, _number, _observe, _times

# --------------------------------------------------------------------------------------------
# 09a: memory and rematerialisation

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


@_exercise("09a_memory_and_remat", cases=[(10**9, 4 * 10**9, 8), (10**6, 10**8, 4)],
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


def _peak_activation_bytes(num_layers, input_bytes, inside_bytes, remat):
    """Play a forward and a backward pass through the layers, keeping what each backward
    pass needs, and return the most bytes alive at once."""
    alive = peak = 0
    for _ in range(num_layers):              # forward
        alive += input_bytes + inside_bytes  # the layer's input and intermediate values
        peak = max(peak, alive)
        if remat:
            alive -= inside_bytes            # dropped: the backward pass recomputes them
    for _ in range(num_layers):              # backward, last layer first
        if remat:
            alive += inside_bytes            # recomputed from the kept input
            peak = max(peak, alive)
        alive -= input_bytes + inside_bytes  # used, and freed
    return peak


@_exercise("09a_memory_and_remat", cases=[(12, 100, 400), (4, 10**6, 3 * 10**6)],
           passed="the peak of a forward and backward pass played layer by layer")
def remat_memory(activation_bytes, case):
    """``activation_bytes(num_layers, input_bytes, inside_bytes, remat)``: the activations a
    backward pass keeps for L identical layers, each with an input of ``input_bytes`` and
    intermediate values of ``inside_bytes``; with ``remat`` each layer is rematerialised."""
    L, a, b = case
    got = _observe(lambda: [_number(_call(activation_bytes, "activation_bytes", L, a, b, remat),
                                    "activation_bytes") for remat in (False, True)])
    for remat, g in zip((False, True), got):
        want = _peak_activation_bytes(L, a, b, remat)
        if _close(g, want, rtol=1e-9):
            continue
        if not remat:
            _fail(f"without remat every layer keeps its input and its intermediate values: "
                  f"{_times(g, want)} for {L} layers")
        if _close(g, L * a):
            _fail("with remat the backward pass recomputes one layer at a time and holds that "
                  "layer's intermediate values meanwhile: add one layer's worth")
        if _close(g, L * (a + b)):
            _fail("with remat only each layer's input is kept, not its intermediate values")
        if _close(g, a + b):
            _fail(f"every layer's input is still kept: {L} of them")
        _fail(f"with remat: {_times(g, want)} for {L} layers")
