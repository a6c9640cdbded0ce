"""The checks of the exercises of notebook 06_keras."""
import numpy as np

from ._common import (
    _call,
    _close,
    _exercise,
    _fail,
    _mesh,
    _number,
    _observe,
    _run,
    _softmax_problem,
    _tree,
)

# --------------------------------------------------------------------------------------------
# 06: Keras


def _keras():
    """Keras on JAX (refused in one line where the kernel already runs it on another backend)."""
    import os
    import sys
    if "keras" in sys.modules:
        import keras
        if keras.backend.backend() != "jax":
            _fail(f"Keras runs on {keras.backend.backend()}: set "
                  f"os.environ['KERAS_BACKEND'] = 'jax' before importing keras, then restart")
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import keras
    return keras


def _build():
    """A small model with BatchNorm, its SGD optimizer, the loss and the initial state."""
    keras = _keras()
    from d2l_multi.keras_models import keras_train_state
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5),
                              keras.layers.BatchNormalization(), keras.layers.Dense(3)])
    optimizer = keras.optimizers.SGD(0.1)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return model, optimizer, loss_fn, keras_train_state(model, optimizer)


@_exercise("06_keras", cases=[1],
           passed="the sharded stateless step equals the library's, moving statistics "
                  "included")
def keras_step(make_train_step, seed):
    """``make_train_step(model, loss_fn, optimizer)`` returns a stateless
    ``train_step(state, X, y) -> (loss, state)`` with state = (trainable, non-trainable,
    optimizer variables); jit-compiled on a batch sharded over 8 devices it must equal one
    device's step, BatchNorm's moving statistics included."""
    _, X, y = _softmax_problem(70 + seed, 32)

    def probe():
        import jax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P
        model, optimizer, loss_fn, initial = _build()
        step = _call(make_train_step, "make_train_step", model, loss_fn, optimizer)
        sharded = jax.jit(lambda s, X, y: _call(step, "train_step", s, X, y))
        mesh = _mesh((8,), ("data",))
        state = jax.device_put(initial, NamedSharding(mesh, P()))
        batch = jax.device_put((X, y), NamedSharding(mesh, P("data")))
        out = _run(sharded, state, *batch, name="train_step")
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            return {"returned": type(out).__name__}
        loss, new = out
        if not isinstance(new, (tuple, list)) or len(new) != 3 or not all(
                isinstance(part, (tuple, list)) for part in new):
            return {"state": "other"}
        return {"loss": _number(loss, "train_step"), "state": _tree(tuple(list(p) for p in new))}
    seen = _observe(probe)
    if "returned" in seen:
        _fail("train_step should return (loss, state)")
    from d2l_multi.keras_models import make_keras_train_step
    model, optimizer, loss_fn, initial = _build()
    want_loss, want = make_keras_train_step(model, loss_fn, optimizer)(initial, X, y)
    want = [[np.asarray(a) for a in part] for part in want]
    got = seen["state"]
    if got == "other" or [len(p) for p in got] != [len(p) for p in want] or any(
            np.shape(a) != np.shape(b) for gp, wp in zip(got, want) for a, b in zip(gp, wp)):
        _fail("the new state should have the structure of the old: (trainable, non-trainable, "
              "optimizer variables)")
    initial = [[np.asarray(a) for a in part] for part in initial]

    def same(a, b, **tol):
        return all(_close(x, y, **tol) for x, y in zip(a, b))
    tol = {"rtol": 1e-4, "atol": 1e-6}
    if all(same(g, w, **tol) for g, w in zip(got, want)) and _close(
            seen["loss"], float(want_loss), rtol=1e-4):
        return
    trainable_ok, moving_ok = same(got[0], want[0], **tol), same(got[1], want[1], **tol)
    moving_same, trained_same = same(got[1], initial[1]), same(got[0], initial[0])
    if trainable_ok and moving_same:
        _fail("BatchNorm's moving statistics did not change: return the non-trainable "
              "variables that stateless_call gives back")
    if trained_same:
        _fail("the trainable variables did not change: apply the gradients with "
              "optimizer.stateless_apply")
    if moving_same:
        _fail("BatchNorm's moving statistics did not change: call the model with "
              "training=True and keep the non-trainable variables it returns")
    if not trainable_ok or not moving_ok:
        _fail("the step on 8 devices differs from one device's step")
    _fail("the returned loss is not the batch's mean loss")
