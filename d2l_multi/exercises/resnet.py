"""The checks of the exercises of notebook 05c_resnet."""
import math

from ._common import _call, _close, _exercise, _fail, _number, _observe, _times

# --------------------------------------------------------------------------------------------
# 05c: ResNet and arithmetic per byte


def _step_flops(layers, batch):
    """The FLOPs of the matrix products in one training step (forward, and gradients of the
    weights and of the inputs) of layers that each apply a weight of ``params`` values at
    ``uses`` positions per example, counted in the program JAX traces."""
    import jax
    import jax.numpy as jnp

    def loss(weights, inputs):
        return sum(jnp.sum(x @ w) for x, w in zip(inputs, weights))
    weights = [jax.ShapeDtypeStruct((1, p), jnp.float32) for p, _ in layers]
    inputs = [jax.ShapeDtypeStruct((batch * r, 1), jnp.float32) for _, r in layers]
    jaxpr = jax.make_jaxpr(jax.grad(loss, argnums=(0, 1)))(weights, inputs).jaxpr
    flops = 0
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == "dot_general":
            (contracted, _), _ = eqn.params["dimension_numbers"]
            size = math.prod(eqn.invars[0].aval.shape[d] for d in contracted)
            flops += 2 * size * math.prod(eqn.outvars[0].aval.shape)
    return flops


@_exercise("05c_resnet",
           cases=[([(1000, 1), (500, 1)], 32),                        # dense layers
                  ([(3 * 3 * 16 * 32, 14 * 14), (800 * 128, 1)], 16)],  # a convolution, a dense
           passed="the FLOPs JAX's program of a training step runs, per byte of float32 "
                  "gradient")
def flops_per_byte(flops_per_gradient_byte, case):
    """``flops_per_gradient_byte(layers, batch_per_device)``: a training step's FLOPs per byte
    of float32 gradient; ``layers`` lists (parameters, uses of each parameter per example)."""
    layers, b = case
    got = _observe(lambda: _number(_call(flops_per_gradient_byte, "flops_per_gradient_byte",
                                         [tuple(x) for x in layers], b),
                                   "flops_per_gradient_byte"))
    params = sum(p for p, _ in layers)
    want = _step_flops(layers, b) / (4 * params)  # float32: 4 bytes per gradient value
    if _close(got, want, rtol=1e-6):
        return
    if _close(got, want / 3):
        _fail("3\u00d7 too small: you counted the forward pass only; the backward pass costs "
              "about twice as much (the gradients of the weights and of the inputs)")
    if _close(got, want * 4):
        _fail("4\u00d7 too large: that is FLOPs per gradient value; a float32 gradient takes 4 "
              "bytes")
    if any(r != 1 for _, r in layers) and _close(
            got, _step_flops([(p, 1) for p, _ in layers], b) / (4 * params)):
        _fail("you left out the reuse: a convolution uses each weight at every output "
              "position, so multiply each layer's parameters by its uses per example")
    if _close(got, want / b):
        _fail("your count does not grow with the batch: every example costs the same FLOPs, "
              "while the gradient's size stays the same")
    _fail(f"{_times(got, want)} for layers {layers} and {b} examples per device")
