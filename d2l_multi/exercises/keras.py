"""The checks of the exercises of notebook 06_keras."""
from ._common import _call, _close, _exercise, _fail, _mesh, _number, _run, _softmax_problem

# --------------------------------------------------------------------------------------------
# 06: Keras

@_exercise("06_keras")
def keras_step(make_train_step, hidden=False):
    """``make_train_step(model, loss_fn, optimizer)`` returns a stateless
    ``train_step(state, X, y) -> (loss, state)`` with state = (trainable, non-trainable,
    optimizer variables); jit-compiled on a batch sharded over 8 devices it must equal one
    device's step, BatchNorm's moving statistics included."""
    import os
    import sys
    if "keras" in sys.modules:
        import keras
        if keras.backend.backend() != "jax":
            _fail(f"Keras runs on {keras.backend.backend()}: set "
                  f"os.environ['KERAS_BACKEND'] = 'jax' before importing keras, then restart")
    os.environ.setdefault("KERAS_BACKEND", "jax")
    import jax
    import keras
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from ..keras_models import keras_train_state, make_keras_train_step

    def build():
        keras.utils.set_random_seed(0)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(5),
                                  keras.layers.BatchNormalization(), keras.layers.Dense(3)])
        optimizer = keras.optimizers.SGD(0.1)
        return model, optimizer, keras_train_state(model, optimizer)

    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    model, optimizer, initial = build()
    one_device = make_keras_train_step(model, loss_fn, optimizer)  # the library's, jitted
    step = _call(make_train_step, "make_train_step", model, loss_fn, optimizer)
    sharded = jax.jit(lambda s, X, y: _call(step, "train_step", s, X, y))
    mesh = _mesh((8,), ("data",))
    for seed in [1] + ([2, 3] if hidden else []):  # hidden: other batches, same shapes
        _, X, y = _softmax_problem(70 + seed, 32)
        want_loss, want = one_device(initial, X, y)
        state = jax.device_put(initial, NamedSharding(mesh, P()))
        batch = jax.device_put((X, y), NamedSharding(mesh, P("data")))
        out = _run(sharded, state, *batch, name="train_step")
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            _fail("train_step should return (loss, state)")
        got_loss, got = out
        if jax.tree.structure(got) != jax.tree.structure(want):
            _fail("the new state should have the structure of the old: (trainable, "
                  "non-trainable, optimizer variables)")
        same = [_close(a, b, rtol=1e-4, atol=1e-6) for a, b in
                zip(jax.tree.leaves(got), jax.tree.leaves(want))]
        if all(same) and _close(_number(got_loss, "train_step"), float(want_loss), rtol=1e-4):
            continue
        trainable_ok = all(_close(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(got[0], want[0]))
        moving_ok = all(_close(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(got[1], want[1]))
        moving_same = all(_close(a, b) for a, b in zip(got[1], state[1]))
        trained_same = all(_close(a, b) for a, b in zip(got[0], state[0]))
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
    return "the sharded stateless step equals one device's, moving statistics included"
