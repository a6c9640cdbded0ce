"""Flax models trained data-parallel: the Flax examples' CNN with a TrainState, made parallel
with ``pmap`` (``apply_model`` / ``update_model``) and with ``jit`` + shardings; a CNN with
BatchNorm; and d2l's ResNet-18 adapted to 28x28 images."""
import functools
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from flax.training import train_state
from jax import lax

import d2l_multi as d2l


class CNN(nn.Module):
    """The Flax examples' CNN: two 3x3 convolutions with average pooling, two dense layers."""

    @nn.compact
    def __call__(self, x):
        x = nn.avg_pool(nn.relu(nn.Conv(32, kernel_size=(3, 3))(x)), (2, 2), strides=(2, 2))
        x = nn.avg_pool(nn.relu(nn.Conv(64, kernel_size=(3, 3))(x)), (2, 2), strides=(2, 2))
        x = x.reshape((x.shape[0], -1))  # flatten: (batch, 7 * 7 * 64)
        x = nn.relu(nn.Dense(256)(x))
        return nn.Dense(10)(x)


def create_train_state(rng, learning_rate, momentum):
    """A TrainState holding CNN's parameters (initialised from ``rng``) and SGD with momentum."""
    cnn = CNN()
    params = cnn.init(rng, jnp.ones([1, 28, 28, 1]))["params"]
    tx = optax.sgd(learning_rate, momentum)
    return train_state.TrainState.create(apply_fn=cnn.apply, params=params, tx=tx)


def cross_entropy_loss(params, state, images, labels):
    """Mean softmax cross-entropy of ``state``'s model with ``params``; returns (loss, logits)."""
    logits = state.apply_fn({"params": params}, images)
    loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
    return loss, logits


@functools.partial(jax.pmap, axis_name="devices")
def apply_model(state, images, labels):
    """Gradients, loss and accuracy of each device's shard, averaged over all devices."""
    grad_fn = jax.value_and_grad(cross_entropy_loss, has_aux=True)
    (loss, logits), grads = grad_fn(state.params, state, images, labels)
    accuracy = jnp.mean(jnp.argmax(logits, -1) == labels)
    return lax.pmean((grads, loss, accuracy), axis_name="devices")  # the allreduce


@jax.pmap
def update_model(state, grads):
    """The same SGD update on every device (the gradients are already averaged)."""
    return state.apply_gradients(grads=grads)


@jax.jit
def jit_train_step(state, images, labels):
    """One step with ``jit``: a batch sharded over the devices makes it data parallel."""
    grad_fn = jax.value_and_grad(cross_entropy_loss, has_aux=True)
    (loss, logits), grads = grad_fn(state.params, state, images, labels)
    accuracy = jnp.mean(jnp.argmax(logits, -1) == labels)
    return state.apply_gradients(grads=grads), loss, accuracy


class CNNBatchNorm(nn.Module):
    """CNN with BatchNorm after each convolution. ``axis_name``: the device axis that BatchNorm
    averages its batch statistics over under ``pmap`` (None: each device uses its own)."""
    axis_name: Any = None

    @nn.compact
    def __call__(self, x, train=True):
        norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9,
                                 axis_name=self.axis_name)
        x = nn.avg_pool(nn.relu(norm()(nn.Conv(32, (3, 3))(x))), (2, 2), strides=(2, 2))
        x = nn.avg_pool(nn.relu(norm()(nn.Conv(64, (3, 3))(x))), (2, 2), strides=(2, 2))
        x = nn.relu(nn.Dense(256)(x.reshape((x.shape[0], -1))))
        return nn.Dense(10)(x)


class Residual(nn.Module):
    """d2l's residual block: two 3x3 conv + BatchNorm, optionally a 1x1 conv on the shortcut."""
    channels: int
    strides: int = 1
    use_1x1conv: bool = False
    axis_name: Any = None

    @nn.compact
    def __call__(self, x, train=True):
        norm = functools.partial(nn.BatchNorm, use_running_average=not train, momentum=0.9,
                                 axis_name=self.axis_name)
        y = nn.Conv(self.channels, (3, 3), self.strides, padding=1)(x)
        y = nn.Conv(self.channels, (3, 3), padding=1)(nn.relu(norm()(y)))
        y = norm()(y)
        if self.use_1x1conv:
            x = nn.Conv(self.channels, (1, 1), self.strides)(x)
        return nn.relu(y + x)


class ResNet(nn.Module):
    """d2l's ResNet for 28x28 inputs: a 3x3 stem without max-pooling, then one stage per
    ``(num_residuals, channels)`` in ``arch``; every stage but the first halves the size."""
    arch: Any
    num_classes: int = 10
    axis_name: Any = None

    @nn.compact
    def __call__(self, x, train=True):
        x = nn.Conv(self.arch[0][1], (3, 3), padding=1)(x)
        x = nn.relu(nn.BatchNorm(use_running_average=not train, momentum=0.9,
                                 axis_name=self.axis_name)(x))
        for stage, (num_residuals, channels) in enumerate(self.arch):
            for block in range(num_residuals):
                first = stage > 0 and block == 0  # halve the size, change the channels
                x = Residual(channels, strides=2 if first else 1, use_1x1conv=first,
                             axis_name=self.axis_name)(x, train)
        x = jnp.mean(x, axis=(1, 2))  # global average pooling
        return nn.Dense(self.num_classes)(x)


def ResNet18(num_classes=10, width=64, axis_name=None):
    """ResNet-18: four stages of two residual blocks, ``width`` to 8x ``width`` channels."""
    arch = tuple((2, width * 2 ** i) for i in range(4))
    return ResNet(arch, num_classes, axis_name)


class TrainState(train_state.TrainState):
    """A TrainState that also carries BatchNorm's running statistics."""
    batch_stats: Any = None


def create_bn_train_state(rng, model, learning_rate, momentum):
    """A TrainState (with ``batch_stats``) for a BatchNorm ``model`` on 28x28 images."""
    init = jax.jit(functools.partial(model.init, train=False))  # compiled once, not op by op
    variables = init(rng, jnp.ones([1, 28, 28, 1]))
    return TrainState.create(apply_fn=model.apply, params=variables["params"],
                             batch_stats=variables["batch_stats"],
                             tx=optax.sgd(learning_rate, momentum))


def bn_train_step(state, images, labels, axis_name=None):
    """One SGD step of a BatchNorm model; under ``pmap`` pass the device ``axis_name``."""
    def loss_fn(params):
        logits, updates = state.apply_fn(
            {"params": params, "batch_stats": state.batch_stats}, images, train=True,
            mutable=["batch_stats"])
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, labels).mean()
        return loss, (logits, updates["batch_stats"])
    (loss, (logits, batch_stats)), grads = jax.value_and_grad(loss_fn, has_aux=True)(
        state.params)
    if axis_name is not None:  # pmap: average the gradients ourselves
        grads, loss = lax.pmean((grads, loss), axis_name)
    accuracy = jnp.mean(jnp.argmax(logits, -1) == labels)
    return state.apply_gradients(grads=grads, batch_stats=batch_stats), loss, accuracy


@jax.jit
def num_correct_flax(state, images, labels):
    """How many predictions of ``state``'s model (in inference mode) equal ``labels``."""
    variables = {"params": state.params}
    if getattr(state, "batch_stats", None) is not None:
        variables["batch_stats"] = state.batch_stats
        logits = state.apply_fn(variables, images, train=False)
    else:
        logits = state.apply_fn(variables, images)
    return (jnp.argmax(logits, -1) == labels).sum()


def evaluate_flax(state, data_iter):
    """Accuracy of an unreplicated Flax ``state`` over ``data_iter``."""
    metric = d2l.Accumulator(2)  # number correct, number of examples
    for X, y in data_iter:
        metric.add(num_correct_flax(state, X, y), y.size)
    return metric[0] / metric[1]


def train_sharded(state, data, num_devices, batch_size, num_epochs):
    """Train a BatchNorm model's ``state`` data parallel with jit + shardings, timed per epoch."""
    mesh = d2l.device_mesh((num_devices,))
    d2l.check_divisible(batch_size, num_devices)
    step = jax.jit(bn_train_step)
    state = d2l.shard(state, mesh)  # replicated: P()
    X0, y0 = data.train[0][:batch_size], data.train[1][:batch_size]
    jax.block_until_ready(step(state, *d2l.shard_batch(X0, y0, mesh)))  # compile, untimed
    animator = d2l.Animator("epoch", "test acc", xlim=[1, max(num_epochs, 2)], ylim=[0, 1])
    timer, history = d2l.Timer(), []
    for epoch in range(num_epochs):
        timer.start()
        for X, y in data.get_dataloader(True, batch_size, drop_last=True):
            state, loss, _ = step(state, *d2l.shard_batch(X, y, mesh))
        loss = float(loss)  # waits for the last step, so the timer sees all the work
        timer.stop()
        acc = evaluate_flax(state, data.get_dataloader(False, batch_size))
        animator.add(epoch + 1, acc)
        history.append({"epoch": epoch + 1, "loss": loss, "test_acc": acc,
                        "sec": timer.times[-1]})
    print(f"test acc: {acc:.2f}, {timer.avg():.1f} sec/epoch on {d2l.describe(mesh.devices.flat)}")
    return state, history, animator
