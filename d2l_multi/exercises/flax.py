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
    _observe,
    _run,
    _scale,
    _softmax_problem,
)

# --------------------------------------------------------------------------------------------
# 05a: Flax


def _model_and_optimizer():
    import optax
    from flax import nnx
    model = nnx.Linear(4, 3, rngs=nnx.Rngs(0))
    return model, nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)


def _params(model):
    import jax
    from flax import nnx
    return [np.asarray(a) for a in jax.tree.leaves(nnx.state(model, nnx.Param))]


def _one_device_step(model, optimizer, X, y):
    """One optax step on the mean cross-entropy, on one device: what the answer must equal."""
    import optax
    from flax import nnx

    def loss_fn(model):
        return optax.softmax_cross_entropy_with_integer_labels(model(X), y).mean()
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


@_exercise("05a_flax", cases=[1],
           passed="the sharded step equals one device's step on the whole batch")
def nnx_step(train_step, seed):
    """``train_step(model, optimizer, X, y)``: one optimizer step on the mean softmax
    cross-entropy of ``model(X)``, in place, returning the loss. Run under ``nnx.jit`` with a
    replicated model and a batch sharded over 8 devices, it must equal one device's step."""
    _, X, y = _softmax_problem(50 + seed, 32)
    n = len(X)

    def probe():
        import jax
        from flax import nnx
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P
        mesh = _mesh((8,), ("data",))
        model, optimizer = _model_and_optimizer()
        nnx.update((model, optimizer), jax.device_put(nnx.state((model, optimizer)),
                                                      NamedSharding(mesh, P())))
        batch = jax.device_put((X, y), NamedSharding(mesh, P("data")))
        sharded = nnx.jit(lambda m, o, X, y: _call(train_step, "train_step", m, o, X, y))
        loss = _number(_run(sharded, model, optimizer, *batch, name="train_step"),
                       "train_step")
        return {"params": _params(model), "loss": loss}
    seen = _observe(probe)
    model, optimizer = _model_and_optimizer()
    before = _params(model)
    loss = float(_one_device_step(model, optimizer, X, y))
    want, got = _params(model), seen["params"]
    if len(got) != len(want) or not all(
            _close(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(got, want)):
        delta = [np.asarray(a) - b for a, b in zip(got, before)]
        r = _scale(delta, [a - b for a, b in zip(want, before)])
        if _near(r, n):
            _fail(f"your update is {n}\u00d7 too large (the global batch): the loss sums over "
                  f"the examples; take the mean, so the step does not grow with the batch or "
                  f"the number of devices")
        if r is not None and abs(r) < 1e-6:
            _fail("the parameters did not change: apply the gradients with "
                  "optimizer.update(model, grads)")
        if _near(r, -1):
            _fail("your update climbs the loss: differentiate the loss itself")
        _fail("the step on 8 devices differs from one device's step on the whole batch")
    if not _close(seen["loss"], loss, rtol=1e-4):
        _fail("the parameters are right but the returned loss is not the batch's mean loss")
