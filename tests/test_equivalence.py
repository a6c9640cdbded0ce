"""Same initial parameters, same global batches, K SGD steps: every data-parallel formulation in
the chapter reaches the parameters of the single-device run.

Tolerance: ``allclose(rtol=1e-5, atol=1e-6)`` (float32; the data-parallel runs only sum the
same numbers in a different order), looser only where stated. Every run uses SGD (with or without
momentum): Adam rescales each update by the gradient's own history, so it does not keep rounding
differences small (notebook 06, exercise 4).
Inputs are random (no dataset needed) and small (4 examples per device) to stay fast;
parameters are filled with NumPy so no random-initialisation code has to compile.
"""
import jax
import numpy as np
import optax
import pytest
from flax import jax_utils
from flax.training import train_state
from jax import lax
from jax.sharding import PartitionSpec as P
from trees import assert_trees_close, cnn_from_linen, image_batches

import d2l_multi as d2l

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
    return image_batches(BATCH, K)


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


def test_unreplicate_leaves_one_copy_on_the_first_device(lenet_params, batches):
    # a[0] would leave each leaf replicated on every device, and an evaluation with it would
    # run on all of them
    devices = d2l.devices(NUM_DEVICES)
    params, _ = d2l.train_batch(d2l.replicate(lenet_params, devices), *batches[0],
                                NUM_DEVICES, LR)
    for leaf, want in zip(d2l.unreplicate(params), lenet_params):
        assert leaf.devices() == {devices[0]} and leaf.shape == want.shape


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


# ----- Flax, classic: Linen TrainState with pmap (apply_model / update_model) vs jit -----

def flax_state(seed=0, momentum=0.9):
    """The classic TrainState of LinenCNN, parameters filled by NumPy, on the host."""
    model = d2l.LinenCNN()
    shapes = jax.eval_shape(model.init, jax.random.key(0), jax.ShapeDtypeStruct(
        (1, 28, 28, 1), np.float32))
    return jax.device_get(train_state.TrainState.create(
        apply_fn=model.apply, params=numpy_like(shapes, seed)["params"],
        tx=optax.sgd(LR, momentum)))


def test_flax_pmap_equals_flax_jit(batches, mesh):
    state = flax_state()
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
    """The Linen CNN trained K steps on one device, unsharded batches."""
    state = jax.device_put(flax_state(), jax.devices()[0])
    for X, y in batches:
        state, _, _ = d2l.jit_train_step(state, X, y)
    return state


def test_flax_pmap_equals_flax_single_device(batches, flax_single_device):
    pmapped = jax_utils.replicate(flax_state())
    for X, y in batches:
        grads, _, _ = d2l.apply_model(pmapped, *d2l.split_batch(X, y, NUM_DEVICES))
        pmapped = d2l.update_model(pmapped, grads)
    pmapped = jax_utils.unreplicate(pmapped)
    assert_trees_close(pmapped.params, flax_single_device.params)
    assert_trees_close(pmapped.opt_state, flax_single_device.opt_state)


def test_flax_jit_sharding_equals_flax_single_device(batches, mesh, flax_single_device):
    sharded = d2l.shard(flax_state(), mesh)
    for X, y in batches:
        sharded, _, _ = d2l.jit_train_step(sharded, *d2l.shard_batch(X, y, mesh))
    assert len(sharded.params["Dense_0"]["kernel"].sharding.device_set) == NUM_DEVICES
    assert_trees_close(sharded.params, flax_single_device.params)
    assert_trees_close(sharded.opt_state, flax_single_device.opt_state)


# ----- Flax, modern: NNX with nnx.jit + shardings; and classic == modern -----

def nnx_cnn(mesh=None):
    """The NNX CNN holding flax_state()'s parameters and its SGD-with-momentum optimizer,
    replicated on ``mesh`` when one is given."""
    from flax import nnx
    model = cnn_from_linen(flax_state().params)
    optimizer = nnx.Optimizer(model, optax.sgd(LR, momentum=0.9), wrt=nnx.Param)
    if mesh is not None:
        nnx.update((model, optimizer), d2l.shard(nnx.state((model, optimizer)), mesh))
    return model, optimizer


def test_nnx_sharded_equals_nnx_single_device(batches, mesh):
    from flax import nnx
    single, sharded = nnx_cnn(), nnx_cnn(mesh)
    for X, y in batches:
        d2l.nnx_train_step(*single, X, y)
        d2l.nnx_train_step(*sharded, *d2l.shard_batch(X, y, mesh))
    kernel = sharded[0].dense1.kernel[...]
    assert kernel.sharding.spec == P() and len(kernel.sharding.device_set) == NUM_DEVICES
    assert int(sharded[1].step[...]) == K
    assert_trees_close(nnx.state(single[0], nnx.Param), nnx.state(sharded[0], nnx.Param))
    assert_trees_close(nnx.state(single[1].opt_state), nnx.state(sharded[1].opt_state))


def test_classic_pmap_equals_modern_nnx(batches, mesh):
    """Notebook 05a's proof: the Linen pmap recipe and the NNX jit + shardings step, started
    from the same parameters (mapped by name), reach the same parameters."""
    from flax import nnx
    pmapped = jax_utils.replicate(flax_state())
    model, optimizer = nnx_cnn(mesh)
    for X, y in batches:
        grads, _, _ = d2l.apply_model(pmapped, *d2l.split_batch(X, y, NUM_DEVICES))
        pmapped = d2l.update_model(pmapped, grads)
        d2l.nnx_train_step(model, optimizer, *d2l.shard_batch(X, y, mesh))
    classic = cnn_from_linen(jax_utils.unreplicate(pmapped).params)
    assert_trees_close(nnx.state(classic, nnx.Param), nnx.state(model, nnx.Param))


def sorted_batches(batches):
    """The batches sorted by label, so that each device's rows hold different classes and
    per-device BatchNorm statistics would differ from global ones."""
    return [(X[np.argsort(y, kind="stable")], np.sort(y, kind="stable")) for X, y in batches]


def test_nnx_batchnorm_resnet_sharded_equals_single_device(batches, mesh):
    """BatchNorm under nnx.jit + shardings uses global statistics: a small ResNet trained on
    8 devices matches one device, running statistics included."""
    from flax import nnx

    def make():
        model = d2l.ResNet(((1, 4), (1, 8)), rngs=nnx.Rngs(0))
        return model, nnx.Optimizer(model, optax.sgd(LR, momentum=0.9), wrt=nnx.Param)
    single, sharded = make(), make()
    nnx.update(sharded, d2l.shard(nnx.state(sharded), mesh))
    for X, y in sorted_batches(batches):
        d2l.nnx_train_step(*single, X, y)
        d2l.nnx_train_step(*sharded, *d2l.shard_batch(X, y, mesh))
    tol = dict(rtol=1e-4, atol=1e-4)  # BatchNorm divides by small variances; ReLU passes or
    # blocks a gradient where an activation is within rounding of zero
    assert_trees_close(nnx.state(single[0], nnx.Param), nnx.state(sharded[0], nnx.Param), tol)
    assert_trees_close(nnx.state(single[0], nnx.BatchStat),
                       nnx.state(sharded[0], nnx.BatchStat), tol)


def test_linen_batchnorm_pmap_statistics(batches):
    """Notebook 05b: under pmap, Linen's BatchNorm with the device axis_name normalises like
    one device; without it, with each device's own statistics."""
    import flax.linen as nn
    X = sorted_batches(batches)[0][0]

    def normalise(axis_name, pmap=True):
        bn = nn.BatchNorm(use_running_average=False, axis_name=axis_name)
        variables = bn.init(jax.random.key(0), X[:1])
        apply = lambda x: bn.apply(variables, x, mutable=["batch_stats"])[0]
        if not pmap:
            return np.asarray(jax.jit(apply)(X))
        out = jax.pmap(apply, axis_name="devices")(X.reshape(NUM_DEVICES, -1, *X.shape[1:]))
        return np.asarray(out).reshape(X.shape)
    one = normalise(None, pmap=False)
    np.testing.assert_allclose(normalise("devices"), one, rtol=1e-4, atol=1e-5)
    assert np.abs(normalise(None) - one).max() > 1e-2


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
    # ... on one device: replicated variables would make evaluate run on all 8
    assert all(v.value.devices() == {jax.devices()[0]} for v in model.variables)
