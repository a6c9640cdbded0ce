"""The checks of the exercises of notebook 09b_remat."""
from ._common import _call, _close, _exercise, _fail, _number, _observe, _times


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


@_exercise("09b_remat", cases=[(12, 100, 400), (4, 10**6, 3 * 10**6)],
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
