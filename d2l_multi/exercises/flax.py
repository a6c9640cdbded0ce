"""The checks of the exercises of notebook 05a_flax."""
import numpy as np

from ._common import (
    _call,
    _close,
    _exercise,
    _fail,
    _mesh,
    _near,
    _number,
    _run,
    _scale,
    _softmax_problem,
)

# --------------------------------------------------------------------------------------------
# 05a: Flax

@_exercise("05a_flax")
def nnx_step(train_step, hidden=False):
    """``train_step(model, optimizer, X, y)``: one optimizer step on the mean softmax
    cross-entropy of ``model(X)``, in place, returning the loss. Run under ``nnx.jit`` with a
    replicated model and a batch sharded over 8 devices, it must equal one device's step."""
    import jax
    import optax
    from flax import nnx
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    def reference(model, optimizer, X, y):
        def loss_fn(model):
            return optax.softmax_cross_entropy_with_integer_labels(model(X), y).mean()
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        optimizer.update(model, grads)
        return loss

    def make():
        model = nnx.Linear(4, 3, rngs=nnx.Rngs(0))
        return model, nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)

    one_device = nnx.jit(reference)
    sharded = nnx.jit(lambda m, o, X, y: _call(train_step, "train_step", m, o, X, y))
    mesh, n = _mesh((8,), ("data",)), 32
    for seed in [1] + ([2, 3] if hidden else []):  # hidden: other batches, same shapes
        _, X, y = _softmax_problem(50 + seed, n)
        model_1, opt_1 = make()
        before = jax.tree.map(np.asarray, nnx.state(model_1, nnx.Param))
        loss_1 = one_device(model_1, opt_1, X, y)
        model_k, opt_k = make()
        nnx.update((model_k, opt_k), jax.device_put(nnx.state((model_k, opt_k)),
                                                    NamedSharding(mesh, P())))
        batch = jax.device_put((X, y), NamedSharding(mesh, P("data")))
        loss_k = _run(sharded, model_k, opt_k, *batch, name="train_step")
        want = jax.tree.map(np.asarray, nnx.state(model_1, nnx.Param))
        got = jax.tree.map(np.asarray, nnx.state(model_k, nnx.Param))
        if not all(_close(a, b, rtol=1e-4, atol=1e-6) for a, b in
                   zip(jax.tree.leaves(got), jax.tree.leaves(want))):
            delta = [a - b for a, b in zip(jax.tree.leaves(got), jax.tree.leaves(before))]
            r = _scale(delta, [a - b for a, b in zip(jax.tree.leaves(want),
                                                     jax.tree.leaves(before))])
            if _near(r, n):
                _fail(f"your update is {n}\u00d7 too large (the global batch): the loss sums "
                      f"over the examples; take the mean, so the step does not grow with the "
                      f"batch or the number of devices")
            if r is not None and abs(r) < 1e-6:
                _fail("the parameters did not change: apply the gradients with "
                      "optimizer.update(model, grads)")
            if _near(r, -1):
                _fail("your update climbs the loss: differentiate the loss itself")
            _fail("the step on 8 devices differs from one device's step on the whole batch")
        if not _close(_number(loss_k, "train_step"), float(loss_1), rtol=1e-4):
            _fail("the parameters are right but the returned loss is not the batch's mean "
                  "loss")
    return "the sharded step equals one device's step"
