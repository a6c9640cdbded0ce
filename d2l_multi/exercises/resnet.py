"""The checks of the exercises of notebook 05c_resnet."""
from ._common import _call, _close, _exercise, _fail, _number, _times

# --------------------------------------------------------------------------------------------
# 05c: ResNet and arithmetic per byte

@_exercise("05c_resnet")
def flops_per_byte(flops_per_gradient_byte, hidden=False):
    """``flops_per_gradient_byte(layers, batch_per_device)``: a training step's FLOPs per byte
    of float32 gradient; ``layers`` lists (parameters, uses of each parameter per example)."""
    cases = [([(1000, 1), (500, 1)], 32),                         # dense layers
             ([(3 * 3 * 16 * 32, 14 * 14), (800 * 128, 1)], 16)]  # a convolution and a dense
    if hidden:
        cases += [([(64, 100)], 1), ([(10, 1), (10, 9), (5, 4)], 128)]
    for layers, b in cases:
        got = _number(_call(flops_per_gradient_byte, "flops_per_gradient_byte", layers, b),
                      "flops_per_gradient_byte")
        params = sum(p for p, _ in layers)
        want = 6 * b * sum(p * r for p, r in layers) / (4 * params)
        if _close(got, want, rtol=1e-6):
            continue
        if _close(got, want / 3):
            _fail("3\u00d7 too small: you counted the forward pass only; the backward pass "
                  "costs about twice as much (6 FLOPs per parameter use, not 2)")
        if _close(got, want * 4):
            _fail("4\u00d7 too large: that is FLOPs per gradient value; a float32 gradient "
                  "takes 4 bytes")
        if _close(got, 6 * b / 4):
            _fail("you left out the reuse: a convolution uses each weight at every output "
                  "position, so multiply each layer's parameters by its uses per example")
        if _close(got, want / b):
            _fail("your count does not grow with the batch: every example costs the same "
                  "FLOPs, while the gradient's size stays the same")
        _fail(f"{_times(got, want)} for layers {layers} and {b} examples per device")
    return "6 FLOPs per parameter use per example, over 4 bytes per gradient value"
