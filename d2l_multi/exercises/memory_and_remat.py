"""The checks of the exercises of notebook 09a_memory_and_remat."""
from ._common import _call, _close, _exercise, _fail, _number, _times

# --------------------------------------------------------------------------------------------
# 09a: memory and rematerialisation

@_exercise("09a_memory_and_remat")
def training_memory(bytes_per_device, hidden=False):
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
def remat_memory(activation_bytes, hidden=False):
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
