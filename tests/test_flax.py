"""The Flax module (notebooks 05a and 05c): the NNX models and their training loop, the map
from the Linen CNN's parameters to the NNX CNN's, ResNet-18's shapes, and argument checks.
The equivalence of the data-parallel steps is in test_equivalence.py."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from recording import RecordingData

import d2l_multi as d2l
from d2l_multi.flax_models import cnn_from_linen

TINY_ARCH = ((1, 4), (1, 8))  # a two-stage ResNet: fast to compile


class TinyData:
    """A stand-in for a data module: 64 training and 32 test images, batches of 16."""

    def __init__(self, seed=0):
        rng = np.random.default_rng(seed)
        self.train = (rng.random((64, 28, 28, 1), dtype=np.float32),
                      rng.integers(0, 10, 64).astype(np.int32))
        self.val = (rng.random((32, 28, 28, 1), dtype=np.float32),
                    rng.integers(0, 10, 32).astype(np.int32))

    def get_dataloader(self, train, batch_size=16, drop_last=False):
        X, y = self.train if train else self.val
        return [(X[i:i + batch_size], y[i:i + batch_size]) for i in range(0, len(y), batch_size)]


def test_cnn_from_linen_maps_the_layers_by_name():
    linen = d2l.LinenCNN()
    params = jax.jit(linen.init)(jax.random.key(1), jnp.ones((1, 28, 28, 1)))["params"]
    model = cnn_from_linen(params)
    X = np.random.default_rng(0).random((4, 28, 28, 1), dtype=np.float32)
    np.testing.assert_allclose(np.asarray(nnx.jit(lambda m, x: m(x))(model, X)), np.asarray(
        jax.jit(linen.apply)({"params": params}, X)), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(model.dense1.kernel[...]),
                                  np.asarray(params["Dense_0"]["kernel"]))


def test_cnn_from_linen_refuses_other_parameters():
    with pytest.raises(ValueError, match=r"no layers \['Conv_1', 'Dense_1'\].*LinenCNN"):
        cnn_from_linen({"Conv_0": {}, "Dense_0": {}})


def test_resnet18_shapes_and_size():
    model = nnx.eval_shape(lambda: d2l.ResNet18(rngs=nnx.Rngs(0)))
    params = nnx.state(model, nnx.Param)
    assert sum(p.size for p in jax.tree.leaves(params)) == 11_175_818  # d2l's ResNet-18
    assert len(model.blocks) == 8 and model.dense.kernel.shape == (512, 10)
    logits = nnx.eval_shape(lambda: d2l.ResNet18(width=2, num_classes=3, rngs=nnx.Rngs(0))(
        jnp.ones((2, 28, 28, 1))))
    assert logits.shape == (2, 3)


@pytest.mark.parametrize("arch, message", [
    ((), "arch is empty"),
    (((2, 0),), "num_channels must be a positive integer, got 0"),
    (((2, 8.5),), "num_channels must be a positive integer, got 8.5"),
    (((0, 8),), "num_residuals must be a positive integer, got 0"),
])
def test_resnet_refuses_a_bad_arch(arch, message):
    with pytest.raises(ValueError, match=message):
        d2l.ResNet(arch, rngs=nnx.Rngs(0))


def test_train_nnx_trains_data_parallel_and_evaluates_in_inference_mode():
    model = d2l.ResNet(TINY_ARCH, rngs=nnx.Rngs(0))
    before = np.asarray(model.bn.mean[...]).copy()
    history = d2l.train_nnx(model, TinyData(), num_devices=2, lr=0.05, num_epochs=2)
    assert [h["epoch"] for h in history] == [1, 2]
    assert all(0 <= h["test_acc"] <= 1 and np.isfinite(h["loss"]) for h in history)
    assert not np.allclose(np.asarray(model.bn.mean[...]), before)  # running statistics moved
    assert model.bn.use_running_average is False  # back in training mode after evaluating
    assert len(model.stem.kernel[...].sharding.device_set) == 2     # replicated on 2 devices


def test_train_nnx_reshuffles_every_epoch_and_a_rerun_sees_the_same_batches():
    data = RecordingData()
    for _ in range(2):
        d2l.train_nnx(d2l.CNN(rngs=nnx.Rngs(0)), data, num_devices=1, lr=0.05, num_epochs=2)
    assert data.epochs == [0, 1, 0, 1]


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(lr=0.0), ValueError, "lr must be a finite positive number"),
    (dict(num_epochs=0), ValueError, "num_epochs must be a positive integer"),
    (dict(num_devices=3), ValueError, "batch size 16 does not divide evenly over 3 devices"),
])
def test_train_nnx_refuses_bad_settings(kwargs, error, message):
    settings = dict(num_devices=2, lr=0.05, num_epochs=1) | kwargs
    with pytest.raises(error, match=message):
        d2l.train_nnx(d2l.CNN(rngs=nnx.Rngs(0)), TinyData(), **settings)


def test_evaluate_nnx_counts_correct_predictions():
    model = d2l.CNN(rngs=nnx.Rngs(0))
    data = TinyData()
    X, _ = data.val
    predicted = np.asarray(jnp.argmax(model(X), -1))
    mesh = d2l.device_mesh((4,))
    assert d2l.evaluate_nnx(model, [(X, predicted)], mesh) == 1.0
    assert d2l.evaluate_nnx(model, [(X, (predicted + 1) % 10)], mesh) == 0.0
