"""Same initial parameters, same global batches, K SGD steps: every data-parallel formulation in
the chapter reaches the parameters of the single-device run.

Tolerance: ``allclose(rtol=1e-5, atol=1e-6)`` (float32; the data-parallel runs only sum the
same numbers in a different order), looser only where stated. Every run uses SGD (with or without
momentum): Adam rescales each update by the gradient's own history, so it does not keep rounding
differences small (notebook 06, exercise 4).
Inputs are random (no dataset needed) and small (4 examples per device) to stay fast;
parameters are filled with NumPy so no random-initialisation code has to compile.
"""
import numpy as np
import optax
import pytest
from flax import jax_utils
from flax.training import train_state
from jax import lax
from jax.sharding import PartitionSpec as P

import jax
import d2l_multi as d2l
from trees import assert_trees_close

K = 3                       # SGD steps, k >= 3
NUM_DEVICES = 8             # conftest simulates 8 CPU devices
BATCH = 4 * NUM_DEVICES     # global batch
LR = 0.1


def numpy_like(shapes, seed=0, scale=0.1):
    """Arrays of the shapes in ``shapes`` (a pytree of ShapeDtypeStructs), filled by NumPy."""
    rng = np.random.default_rng(seed)
    return jax.tree.map(lambda s: (scale * rng.standard_normal(s.shape)).astype(s.dtype), shapes)


@pytest.fixture(scope="module")
def batches():
    rng = np.random.default_rng(1)
    return [(rng.random((BATCH, 28, 28, 1), dtype=np.float32),
             rng.integers(0, 10, BATCH).astype(np.int32)) for _ in range(K)]


@pytest.fixture(scope="module")
def mesh():
    return d2l.device_mesh((NUM_DEVICES,))


# ----- LeNet from scratch: single device vs pmap vs jit + NamedSharding vs shard_map -----

@pytest.fixture(scope="module")
def lenet_params():
    return numpy_like(jax.eval_shape(d2l.init_lenet_params, jax.random.key(0)))


@jax.jit
def sgd_step(params, X, y):
    grads = jax.grad(d2l.loss_fn)(params, X, y)
    return [p - LR * g for p, g in zip(params, grads)]


@pytest.fixture(scope="module")
def single_device(lenet_params, batches):
    params = lenet_params
    for X, y in batches:
        params = sgd_step(params, X, y)
    return params


def test_pmap_step_equals_single_device(lenet_params, batches, single_device):
    params = d2l.replicate(lenet_params, d2l.devices(NUM_DEVICES))
    for X, y in batches:
        params, _ = d2l.train_batch(params, X, y, NUM_DEVICES, LR)
    assert_trees_close(d2l.unreplicate(params), single_device)


def test_jit_sharding_step_equals_single_device(lenet_params, batches, single_device, mesh):
    optimizer = optax.sgd(LR)
    step = d2l.make_train_step(optimizer)
    params = d2l.shard(lenet_params, mesh)
    opt_state = d2l.shard(optimizer.init(lenet_params), mesh)
    for X, y in batches:
        params, opt_state, _ = step(params, opt_state, *d2l.shard_batch(X, y, mesh))
    assert params[0].sharding.spec == P()  # still replicated
    assert_trees_close(params, single_device)


def test_shard_map_step_equals_single_device(lenet_params, batches, single_device, mesh):
    optimizer = optax.sgd(LR)
    step = d2l.make_shard_map_step(mesh, optimizer)
    params, opt_state = d2l.shard(lenet_params, mesh), optimizer.init(lenet_params)
    for X, y in batches:
        params, opt_state, _ = step(params, opt_state, *d2l.shard_batch(X, y, mesh))
    assert_trees_close(params, single_device)


GRAD_VARIANTS = {
    "grad_then_pmean": lambda p, X, y: lax.pmean(jax.grad(d2l.loss_fn)(p, X, y), "data"),
    "grad_of_pmean": lambda p, X, y: jax.grad(lambda q: lax.pmean(d2l.loss_fn(q, X, y),
                                                                  "data"))(p),
}


@pytest.mark.parametrize("variant,check_vma,expected", [
    ("grad_of_pmean", True, "mean"),       # the library's step: right
    ("grad_then_pmean", True, "k_times"),  # the pmap habit under vma: grad already summed
    ("grad_then_pmean", False, "mean"),    # pmap semantics: right
    ("grad_of_pmean", False, "local"),     # each device its own local gradient: replicas differ
])
def test_shard_map_gradient_variants(lenet_params, batches, mesh, variant, check_vma, expected):
    """Inside shard_map, with check_vma=True jax.grad w.r.t. the replicated (unvarying) params
    sums the devices' gradients; with check_vma=False grad is per device, as in pmap."""
    X, y = batches[0]
    f = GRAD_VARIANTS[variant]
    stacked = lambda *args: jax.tree.map(lambda g: g[None], f(*args))  # every device's result
    grads = jax.jit(jax.shard_map(stacked, mesh=mesh, in_specs=(P(), P("data"), P("data")),
                                  out_specs=P("data"), check_vma=check_vma))(lenet_params, X, y)
    grad = jax.jit(jax.grad(d2l.loss_fn))
    mean = grad(lenet_params, X, y)
    if expected == "local":
        per_device = zip(np.split(X, NUM_DEVICES), np.split(y, NUM_DEVICES))
        expect = [np.stack(leaves) for leaves in zip(*(grad(lenet_params, Xd, yd)
                                                        for Xd, yd in per_device))]
    else:
        scale = NUM_DEVICES if expected == "k_times" else 1
        expect = [np.broadcast_to(scale * g, (NUM_DEVICES, *g.shape)) for g in mean]
    assert_trees_close(grads, expect, tol=dict(rtol=1e-5, atol=1e-5))


# ----- Flax: pmap (apply_model / update_model) vs jit + NamedSharding -----

def flax_state(model, seed=0, momentum=0.9):
    shapes = jax.eval_shape(model.init, jax.random.key(0), jax.ShapeDtypeStruct(
        (1, 28, 28, 1), np.float32))
    variables = numpy_like(shapes, seed)
    if "batch_stats" in variables:  # BatchNorm: running mean 0, variance 1
        variables["batch_stats"] = jax.tree_util.tree_map_with_path(
            lambda path, v: np.ones_like(v) if "var" in jax.tree_util.keystr(path)
            else np.zeros_like(v), variables["batch_stats"])
        return jax.device_get(d2l.TrainState.create(
            apply_fn=model.apply, params=variables["params"],
            batch_stats=variables["batch_stats"], tx=optax.sgd(LR, momentum)))
    return jax.device_get(train_state.TrainState.create(
        apply_fn=model.apply, params=variables["params"], tx=optax.sgd(LR, momentum)))


def test_flax_pmap_equals_flax_jit(batches, mesh):
    state = flax_state(d2l.CNN())
    pmapped = jax_utils.replicate(state)
    sharded = d2l.shard(state, mesh)
    for X, y in batches:
        grads, _, _ = d2l.apply_model(pmapped, *d2l.split_batch(X, y, NUM_DEVICES))
        pmapped = d2l.update_model(pmapped, grads)
        sharded, _, _ = d2l.jit_train_step(sharded, *d2l.shard_batch(X, y, mesh))
    pmapped = jax_utils.unreplicate(pmapped)
    assert int(pmapped.step) == int(sharded.step) == K
    assert_trees_close(pmapped.params, sharded.params)
    assert_trees_close(pmapped.opt_state, sharded.opt_state)  # momentum buffers too


@pytest.fixture(scope="module")
def flax_single_device(batches):
    """The Flax CNN trained K steps on one device, unsharded batches."""
    state = jax.device_put(flax_state(d2l.CNN()), jax.devices()[0])
    for X, y in batches:
        state, _, _ = d2l.jit_train_step(state, X, y)
    return state


def test_flax_pmap_equals_flax_single_device(batches, flax_single_device):
    pmapped = jax_utils.replicate(flax_state(d2l.CNN()))
    for X, y in batches:
        grads, _, _ = d2l.apply_model(pmapped, *d2l.split_batch(X, y, NUM_DEVICES))
        pmapped = d2l.update_model(pmapped, grads)
    pmapped = jax_utils.unreplicate(pmapped)
    assert_trees_close(pmapped.params, flax_single_device.params)
    assert_trees_close(pmapped.opt_state, flax_single_device.opt_state)


def test_flax_jit_sharding_equals_flax_single_device(batches, mesh, flax_single_device):
    sharded = d2l.shard(flax_state(d2l.CNN()), mesh)
    for X, y in batches:
        sharded, _, _ = d2l.jit_train_step(sharded, *d2l.shard_batch(X, y, mesh))
    assert len(sharded.params["Dense_0"]["kernel"].sharding.device_set) == NUM_DEVICES
    assert_trees_close(sharded.params, flax_single_device.params)
    assert_trees_close(sharded.opt_state, flax_single_device.opt_state)


def test_flax_batchnorm_global_statistics(batches, mesh):
    """BatchNorm under jit + shardings == pmap with axis_name: global batch statistics."""
    state = flax_state(d2l.CNNBatchNorm())
    synced_model = d2l.CNNBatchNorm(axis_name="devices")
    step_pmap = jax.pmap(lambda s, X, y: d2l.bn_train_step(s, X, y, axis_name="devices"),
                         axis_name="devices")
    step_jit = jax.jit(d2l.bn_train_step)
    sharded = d2l.shard(state, mesh)
    pmapped = jax_utils.replicate(state.replace(apply_fn=synced_model.apply))
    for X, y in batches:
        order = np.argsort(y, kind="stable")  # shards whose own statistics differ
        X, y = X[order], y[order]
        sharded, _, _ = step_jit(sharded, *d2l.shard_batch(X, y, mesh))
        pmapped, _, _ = step_pmap(pmapped, *d2l.split_batch(X, y, NUM_DEVICES))
    pmapped = jax_utils.unreplicate(pmapped)
    assert_trees_close(pmapped.params, sharded.params, tol=dict(rtol=1e-4, atol=1e-5))
    assert_trees_close(pmapped.batch_stats, sharded.batch_stats, tol=dict(rtol=1e-4, atol=1e-5))


# ----- Keras 3 on JAX: the stateless data-parallel step vs the single-device step -----

def small_keras_model():
    import keras
    inputs = keras.Input(shape=(28, 28, 1))
    x = keras.layers.Conv2D(4, 3, strides=2, use_bias=False)(inputs)
    x = keras.layers.ReLU()(keras.layers.BatchNormalization()(x))
    x = keras.layers.GlobalAveragePooling2D()(x)
    x = keras.layers.Dropout(0.5)(x)
    return keras.Model(inputs, keras.layers.Dense(10)(x))


def test_keras_data_parallel_step_equals_single_device(batches, mesh):
    import keras
    keras.utils.set_random_seed(0)
    model = small_keras_model()
    optimizer = keras.optimizers.SGD(learning_rate=LR, momentum=0.9)
    loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    step = d2l.make_keras_train_step(model, loss_fn, optimizer)
    state = d2l.keras_train_state(model, optimizer)
    single, parallel = state, d2l.shard(state, mesh)
    for X, y in batches:
        _, single = step(single, X, y)
        _, parallel = step(parallel, *d2l.shard_batch(X, y, mesh))
    assert_trees_close(single, parallel)  # BatchNorm statistics and the dropout seed too
    # writing back copies the arrays: the Keras model holds the trained values
    d2l.keras_assign_state(model, optimizer, parallel)
    np.testing.assert_array_equal(np.asarray(model.trainable_variables[0].value),
                                  np.asarray(parallel[0][0]))
    assert model.trainable_variables[0].value is not parallel[0][0]
