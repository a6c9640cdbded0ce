"""Flax models trained data parallel, the modern way and the classic way.

Modern (Flax NNX; notebooks 05a and 05c): a module is a Python object that holds its
parameters. ``nnx_train_step`` is one ``nnx.jit``-compiled step; given a batch sharded over the
devices and a replicated model it is the data-parallel step (automatic parallelism).
``train_nnx`` trains a model on 1 or N devices; ``ResNet18`` is d2l's ResNet-18 for 28x28 images.

Classic (Flax Linen + ``pmap``; notebook 05a): the Flax examples' CNN with a ``TrainState``,
replicated with ``pmap`` and trained with ``apply_model`` (gradients averaged by ``lax.pmean``)
and ``update_model``; ``jit_train_step`` runs that ``TrainState`` under ``jit``; and
``cnn_from_linen`` moves the Linen CNN's parameters into the NNX CNN, layer by layer.
"""
import functools
import weakref
from collections.abc import Iterable
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from flax.training import train_state
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jax.typing import ArrayLike

from . import _checks as check
from ._earlier import flax_models as d2l
from .errors import InputError
from .hardware import devices

# ----- Modern: Flax NNX, nnx.jit and shardings -----

class CNN(nnx.Module):
    """The Flax examples' CNN in NNX: two 3x3 convolutions, two dense layers."""

    def __init__(self, *, rngs):
        self.conv1 = nnx.Conv(1, 32, kernel_size=(3, 3), rngs=rngs)
        self.conv2 = nnx.Conv(32, 64, kernel_size=(3, 3), rngs=rngs)
        self.dense1 = nnx.Linear(7 * 7 * 64, 256, rngs=rngs)
        self.dense2 = nnx.Linear(256, 10, rngs=rngs)

    def __call__(self, x):
        x = nnx.avg_pool(nnx.relu(self.conv1(x)), (2, 2), strides=(2, 2))
        x = nnx.avg_pool(nnx.relu(self.conv2(x)), (2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))  # flatten: (batch, 7 * 7 * 64)
        x = nnx.relu(self.dense1(x))
        return self.dense2(x)


@nnx.jit
def nnx_train_step(model, optimizer, images, labels):
    """One ``optimizer`` step on the mean cross-entropy, in place; the loss."""
    def loss_fn(model):
        logits = model(images)
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
        return losses.mean()
    loss, grads = nnx.value_and_grad(loss_fn)(model)
    optimizer.update(model, grads)
    return loss


@nnx.jit
def num_correct_nnx(model, images, labels):
    """How many of ``model``'s predictions equal ``labels``."""
    return (jnp.argmax(model(images), -1) == labels).sum()


def evaluate_nnx(model, data_iter, mesh):
    """Accuracy of ``model`` in inference mode, batches split over ``mesh``."""
    model.eval()
    metric = d2l.Accumulator(2)  # number correct, number of examples
    for X, y in data_iter:
        X, y = jax.device_put((X, y), NamedSharding(mesh, P("data")))
        metric.add(num_correct_nnx(model, X, y), y.size)
    model.train()
    return metric[0] / metric[1]


def train_nnx(model, data, num_devices, lr, num_epochs):
    """Train ``model`` data parallel (SGD with momentum); plot the accuracy."""
    mesh = jax.make_mesh((num_devices,), ("data",), axis_types=(AxisType.Auto,))
    replicated, split = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
    optimizer = nnx.Optimizer(model, optax.sgd(lr, momentum=0.9), wrt=nnx.Param)
    state = jax.device_put(nnx.state((model, optimizer)), replicated)
    nnx.update((model, optimizer), state)
    animator = d2l.Animator("epoch", "test acc", xlim=[1, num_epochs])
    timer, history = d2l.Timer(), []
    train_iter = data.get_dataloader(train=True, drop_last=True)
    for epoch in range(num_epochs):
        timer.start()
        for X, y in train_iter:
            batch = jax.device_put((X, y), split)
            loss = nnx_train_step(model, optimizer, *batch)
        loss = float(loss)  # waits for the last step: the timer sees it all
        timer.stop()
        acc = evaluate_nnx(model, data.get_dataloader(train=False), mesh)
        animator.add(epoch + 1, acc)
        history.append({"epoch": epoch + 1, "loss": loss, "test_acc": acc})
    print(f"test acc: {acc:.2f}, {timer.avg():.1f} sec/epoch on "
          f"{d2l.describe(mesh.devices.flat)}")
    return history


def _check_train_nnx(model: nnx.Module, data: Any, num_devices: int, lr: float,
                     num_epochs: int) -> None:
    """Raise a ValueError for a bad setting of ``train_nnx``, naming the fix."""
    check.positive(lr=lr, num_epochs=num_epochs)
    devices(num_devices)  # that many devices exist
    batch = getattr(data, "batch_size", None)  # no training pass is spent on a check
    if batch is None:
        batch = len(next(iter(data.get_dataloader(train=False)))[0])
    check.divisible(batch, num_devices)


# ----- Classic: Flax Linen, TrainState and pmap -----

class LinenCNN(nn.Module):
    """The same CNN in Linen: layers declared inline; ``init`` makes them."""

    @nn.compact
    def __call__(self, x):
        x = nn.avg_pool(nn.relu(nn.Conv(32, (3, 3))(x)), (2, 2), (2, 2))
        x = nn.avg_pool(nn.relu(nn.Conv(64, (3, 3))(x)), (2, 2), (2, 2))
        x = x.reshape((x.shape[0], -1))  # flatten: (batch, 7 * 7 * 64)
        x = nn.relu(nn.Dense(256)(x))
        return nn.Dense(10)(x)


def create_train_state(rng, learning_rate, momentum):
    """A TrainState: LinenCNN's parameters from ``rng``, SGD with momentum."""
    cnn = LinenCNN()
    params = cnn.init(rng, jnp.ones([1, 28, 28, 1]))["params"]
    tx = optax.sgd(learning_rate, momentum)
    return train_state.TrainState.create(apply_fn=cnn.apply, params=params,
                                         tx=tx)


def cross_entropy_loss(params, state, images, labels):
    """The mean cross-entropy of ``state``'s model; returns (loss, logits)."""
    logits = state.apply_fn({"params": params}, images)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
    return losses.mean(), logits


@functools.partial(jax.pmap, axis_name="devices")
def apply_model(state, images, labels):
    """Each device's gradients, loss and accuracy, averaged over the devices."""
    grad_fn = jax.value_and_grad(cross_entropy_loss, has_aux=True)
    (loss, logits), grads = grad_fn(state.params, state, images, labels)
    accuracy = jnp.mean(jnp.argmax(logits, -1) == labels)
    return lax.pmean((grads, loss, accuracy), axis_name="devices")  # allreduce


@jax.pmap
def update_model(state, grads):
    """The same SGD update on every device (the gradients are averaged)."""
    return state.apply_gradients(grads=grads)


def _check_linen_layers(params, names):
    """Raise a ValueError naming the layers among ``names`` that Linen's ``params`` lacks."""
    missing = sorted(set(names) - set(params))
    if missing:
        raise InputError(f"params has no layers {missing} (it has {sorted(params)}); pass "
                         f"LinenCNN's parameters, e.g. create_train_state(...).params")


def cnn_from_linen(params):
    """An NNX ``CNN`` holding ``LinenCNN``'s ``params``, matched by name."""
    layers = {"conv1": "Conv_0", "conv2": "Conv_1", "dense1": "Dense_0",
              "dense2": "Dense_1"}
    model = nnx.eval_shape(lambda: CNN(rngs=nnx.Rngs(0)))  # no values drawn
    nnx.update(model, {new: dict(params[old]) for new, old in layers.items()})
    return model


def _check_cnn_from_linen(params: dict[str, Any]) -> None:
    """Raise a ValueError unless ``params`` has the layers of ``LinenCNN``."""
    _check_linen_layers(params, ("Conv_0", "Conv_1", "Dense_0", "Dense_1"))


@jax.jit
def jit_train_step(state, images, labels):
    """The classic TrainState's step under ``jit``: (state, loss, accuracy)."""
    grad_fn = jax.value_and_grad(cross_entropy_loss, has_aux=True)
    (loss, logits), grads = grad_fn(state.params, state, images, labels)
    accuracy = jnp.mean(jnp.argmax(logits, -1) == labels)
    return state.apply_gradients(grads=grads), loss, accuracy


train_nnx = check.validated(train_nnx, _check_train_nnx)
cnn_from_linen = check.validated(cnn_from_linen, _check_cnn_from_linen)


# ----- d2l's ResNet-18 in NNX (notebook 05c) -----

class Residual(nnx.Module):
    """d2l's residual block: two 3x3 convolutions with BatchNorm; a 1x1
    convolution adapts the shortcut when the size or the channels change."""

    def __init__(self, in_channels, channels, strides=1, use_1x1conv=False,
                 *, rngs):
        conv = functools.partial(nnx.Conv, rngs=rngs)
        norm = functools.partial(nnx.BatchNorm, channels, momentum=0.9,
                                 rngs=rngs)
        self.conv1 = conv(in_channels, channels, (3, 3), strides, padding=1)
        self.bn1 = norm()
        self.conv2 = conv(channels, channels, (3, 3), padding=1)
        self.bn2 = norm()
        self.conv3 = (conv(in_channels, channels, (1, 1), strides)
                      if use_1x1conv else None)

    def __call__(self, x):
        y = nnx.relu(self.bn1(self.conv1(x)))
        y = self.bn2(self.conv2(y))
        if self.conv3 is not None:
            x = self.conv3(x)
        return nnx.relu(y + x)


def _check_arch(arch: tuple[tuple[int, int], ...], num_classes: int = 10, *,
                rngs: nnx.Rngs) -> None:
    """Raise a ValueError unless ``arch`` is one or more positive ``(num_residuals, channels)``."""
    _check_rngs(rngs=rngs)
    check.positive(num_classes=num_classes)
    if not arch:
        raise InputError("arch is empty: give one (num_residuals, channels) per stage")
    for num_residuals, num_channels in arch:
        check.positive(num_residuals=num_residuals, num_channels=num_channels)


class ResNet(nnx.Module):
    """d2l's ResNet for 28x28 images: a 3x3 stem, then one stage of residual
    blocks per ``(num_residuals, channels)`` in ``arch``."""

    def __init__(self, arch, num_classes=10, *, rngs):
        channels = arch[0][1]
        self.stem = nnx.Conv(1, channels, (3, 3), padding=1, rngs=rngs)
        self.bn = nnx.BatchNorm(channels, momentum=0.9, rngs=rngs)
        blocks = []
        for stage, (num_residuals, out) in enumerate(arch):
            for block in range(num_residuals):
                first = stage > 0 and block == 0  # halve height and width
                blocks.append(Residual(channels, out, 2 if first else 1,
                                       use_1x1conv=first, rngs=rngs))
                channels = out
        self.blocks = nnx.List(blocks)
        self.dense = nnx.Linear(channels, num_classes, rngs=rngs)

    def __call__(self, x):
        x = nnx.relu(self.bn(self.stem(x)))
        for block in self.blocks:
            x = block(x)
        return self.dense(x.mean(axis=(1, 2)))  # global average pooling


def ResNet18(num_classes=10, width=64, *, rngs):
    """ResNet-18: four stages of two residual blocks, ``width`` to 8 x
    ``width`` channels."""
    arch = tuple((2, width * 2 ** i) for i in range(4))
    return ResNet(arch, num_classes, rngs=rngs)


# ----- the checks behind the public names -----

_IO: "weakref.WeakKeyDictionary[nnx.Module, int | None]" = weakref.WeakKeyDictionary()


def _classes(model, images):
    """The classes ``model`` tells images apart (its output size), traced once per model;
    None if it cannot take ``images`` (its own call will say why)."""
    if model not in _IO:
        shape = jax.ShapeDtypeStruct((1, *jnp.shape(images)[1:]), jnp.float32)
        try:
            _IO[model] = nnx.eval_shape(lambda m, x: m(x), model, shape).shape[-1]
        except Exception:
            return None
    return _IO[model]


def _check_rngs(*, rngs: nnx.Rngs) -> None:
    if not isinstance(rngs, nnx.Rngs):
        raise InputError(f"rngs must be an nnx.Rngs, e.g. nnx.Rngs(0), got {rngs!r}")


def _check_batch(model: nnx.Module, images: ArrayLike, labels: ArrayLike) -> None:
    """Refuse images not NHWC, holding NaN, or labels not among ``model``'s classes."""
    check.examples(images, labels, ("images", "labels"))
    check.images(images, name="images")
    check.finite_values(images, "images")
    check.labels(labels, _classes(model, images), "labels")


def _check_step(model: nnx.Module, optimizer: nnx.Optimizer, images: ArrayLike,
                labels: ArrayLike) -> None:
    _check_batch(model, images, labels)


def _check_evaluate(model: nnx.Module, data_iter: Iterable[tuple[ArrayLike, ArrayLike]],
                    mesh: Mesh) -> None:
    check.mesh(mesh)
    if hasattr(data_iter, "__len__"):
        check.nonempty(data_iter=data_iter)


def _check_train_state(rng: jax.Array, learning_rate: float, momentum: float) -> None:
    check.positive(learning_rate=learning_rate)
    check.nonnegative(momentum=momentum)


def _check_linen_batch(state: train_state.TrainState, images: ArrayLike, labels: ArrayLike,
                       stacked: int = 0) -> None:
    """Refuse a batch LinenCNN cannot take (``stacked``: one per device, stacked)."""
    classes = jnp.shape(jax.tree.leaves(state.params)[-1])[-1]
    check.images(images, name="images", stacked=stacked)
    check.finite_values(images, "images")
    check.labels(labels, classes, "labels", stacked=stacked)


def _check_loss(params: Any, state: train_state.TrainState, images: ArrayLike,
                labels: ArrayLike) -> None:
    _check_linen_batch(state, images, labels)


def _check_pmapped(state: train_state.TrainState, images: ArrayLike, labels: ArrayLike) -> None:
    _check_linen_batch(state, images, labels, stacked=1)


def _check_jit_step(state: train_state.TrainState, images: ArrayLike, labels: ArrayLike) -> None:
    _check_linen_batch(state, images, labels)


def _check_update(state: train_state.TrainState, grads: Any) -> None:
    check.tree(grads, "grads")


def _check_residual(in_channels: int, channels: int, strides: int = 1,
                    use_1x1conv: bool = False, *, rngs: nnx.Rngs) -> None:
    check.integer(1, in_channels=in_channels, channels=channels, strides=strides)
    _check_rngs(rngs=rngs)


def _check_resnet18(num_classes: int = 10, width: int = 64, *, rngs: nnx.Rngs) -> None:
    check.integer(1, num_classes=num_classes, width=width)
    _check_rngs(rngs=rngs)


CNN = check.validated(CNN, _check_rngs)
nnx_train_step = check.validated(nnx_train_step, _check_step)
num_correct_nnx = check.validated(num_correct_nnx, _check_batch)
evaluate_nnx = check.validated(check.some_batches(evaluate_nnx), _check_evaluate)
create_train_state = check.validated(create_train_state, _check_train_state)
cross_entropy_loss = check.validated(cross_entropy_loss, _check_loss)
apply_model = check.validated(apply_model, _check_pmapped)
update_model = check.validated(update_model, _check_update)
jit_train_step = check.validated(jit_train_step, _check_jit_step)
Residual = check.validated(Residual, _check_residual)
ResNet = check.validated(ResNet, _check_arch)
ResNet18 = check.validated(ResNet18, _check_resnet18)
