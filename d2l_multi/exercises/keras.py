"""The checks of the exercises of notebook 06_keras."""
import numpy as np

from ._common import (
    _call,
    _close,
    _exercise,
    _fail,
    _mesh,
    _observe,
    _run,
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


_KERNELS = ("up/kernel", "down/kernel")


def _mlp(seed):
    """The MLP the check splits: 8 -> 'up' (32, relu) -> 'down' (4 logits), SGD, the loss."""
    keras = _keras()
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((8,))
    hidden = keras.layers.Dense(32, activation="relu", name="up")(inputs)
    model = keras.Model(inputs, keras.layers.Dense(4, name="down")(hidden))
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    return model, keras.optimizers.SGD(0.1), loss_fn


def _collectives(hlo):
    import re
    return {op: len(re.findall(rf" {op}(-start)?\(", hlo))
            for op in ("all-reduce", "all-gather", "all-to-all", "collective-permute")}


@_exercise("06_keras", cases=[(0, (2, 4))],
           passed="Megatron's split of the MLP: each kernel split over 'model', one "
                  "all-reduce forward, one device's step")
def model_parallel(layout_map, case):
    """``layout_map(device_mesh)`` returns a ``keras.distribution.LayoutMap`` for the MLP
    'up' (8 -> 32, relu), 'down' (32 -> 4) on a ('batch', 'model') mesh: every kernel split
    over 'model', the forward pass with one all-reduce and no all-gather; one step under
    ``ModelParallel`` must equal one device's."""
    seed, mesh_shape = case
    rng = np.random.default_rng(80 + seed)
    X = rng.normal(size=(16, 8)).astype(np.float32)
    y = rng.integers(0, 4, size=16).astype(np.int32)

    def probe():
        import jax
        keras = _keras()
        from d2l_multi.keras_models import keras_train_state, make_keras_train_step
        dist = keras.distribution
        device_mesh = dist.DeviceMesh(mesh_shape, ("batch", "model"),
                                      devices=_mesh(mesh_shape, ("batch", "model")).devices)
        layouts = _call(layout_map, "layout_map", device_mesh)
        if not isinstance(layouts, dist.LayoutMap):
            return {"returned": type(layouts).__name__}
        previous = dist.distribution()
        dist.set_distribution(dist.ModelParallel(layout_map=layouts, batch_dim_name="batch"))
        try:
            model, optimizer, loss_fn = _run(_mlp, seed, name="layout_map")
            state = keras_train_state(model, optimizer)
            split = {v.path: {"spec": [str(a) for a in v.value.sharding.spec],
                              "block": list(v.value.sharding.shard_shape(v.value.shape)),
                              "shape": list(v.value.shape)} for v in model.variables}
            data = dist.distribution().get_data_layout(X.shape)
            batch = (dist.distribute_tensor(X, data),
                     dist.distribute_tensor(y, dist.distribution().get_data_layout(y.shape)))
            forward = jax.jit(lambda t, n, X: model.stateless_call(t, n, X)[0])
            hlo = _run(lambda: forward.lower(state[0], state[1], batch[0]).compile().as_text(),
                       name="layout_map")
            loss, new = _run(make_keras_train_step(model, loss_fn, optimizer), state, *batch,
                             name="layout_map")
        finally:
            dist.set_distribution(previous)
        return {"split": split, "collectives": _collectives(hlo), "initial": _tree(state),
                "state": _tree(new), "loss": float(loss)}
    seen = _observe(probe)
    if "returned" in seen:
        _fail(f"layout_map returned a {seen['returned']}: build a "
              f"keras.distribution.LayoutMap(device_mesh) and return it")
    k = mesh_shape[1]
    for path in _KERNELS:
        leaf = seen["split"].get(path)
        if leaf is None:
            _fail(f"the model has no variable '{path}': the layout map changed the model")
        if "batch" in leaf["spec"]:
            _fail(f"'{path}' is split over 'batch' ({leaf['spec']}): that axis splits the "
                  f"examples; split the kernels over 'model'")
        if np.prod(leaf["block"]) * k != np.prod(leaf["shape"]):
            _fail(f"each device holds a {leaf['block']} block of '{path}' "
                  f"{leaf['shape']}: map the key '{path}' to a layout that splits one of its "
                  f"axes over 'model' (the keys are regular expressions of variable paths)")
    ops = seen["collectives"]
    if ops["all-gather"] or ops["all-to-all"] or ops["collective-permute"]:
        _fail("the forward pass gathers the hidden layer between 'up' and 'down': split "
              "'up' by columns, (None, 'model'), and 'down' by rows, ('model', None), so "
              "each device keeps its own hidden units")
    if ops["all-reduce"] > 1:
        _fail(f"the forward pass adds partial sums {ops['all-reduce']} times: split 'up' by "
              f"columns, so that its outputs need no sum, and 'down' by rows")
    from d2l_multi.keras_models import keras_train_state, make_keras_train_step
    model, optimizer, loss_fn = _mlp(seed)
    keras_train_state(model, optimizer)
    initial = tuple([np.asarray(a) for a in part] for part in seen["initial"])
    want_loss, want = make_keras_train_step(model, loss_fn, optimizer)(initial, X, y)
    if not all(_close(g, w, rtol=1e-5, atol=1e-6) for gp, wp in zip(seen["state"], want)
               for g, w in zip(gp, wp)) or not _close(seen["loss"], float(want_loss),
                                                       rtol=1e-5):
        _fail("one step on the split model differs from one device's step")
