"""Data parallelism from scratch: split a batch over the devices, a pmapped SGD step whose
gradients are averaged with ``lax.pmean``, and LeNet trained on 1 or N devices."""
import functools
import math

import jax
import numpy as np
from jax import lax

import d2l_multi as d2l


def check_divisible(size, parts, what="batch size", over="devices"):
    """Raise a ValueError naming the nearest good sizes unless ``size`` splits into ``parts``."""
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise ValueError(f"the number of {over} must be a positive integer, got {parts!r}")
    if size % parts:
        lower = size - size % parts
        options = " or ".join(str(s) for s in (lower, lower + parts) if s > 0)
        raise ValueError(f"{what} {size} does not divide evenly over {parts} {over}; "
                         f"use a multiple of {parts}, e.g. {options}")


def check_labels(X, y, num_classes=None):
    """Raise a ValueError unless ``y`` holds one label per example of ``X``, and (labels held
    in a NumPy array) each a class index from 0 (below ``num_classes`` if given): JAX takes
    an index out of range for another class without a word."""
    if len(X) != len(y):
        raise ValueError(f"X has {len(X)} examples but y has {len(y)} labels; pass one "
                         f"label per example")
    if not (isinstance(y, np.ndarray) and y.size and np.issubdtype(y.dtype, np.number)):
        return
    low, high = y.min(), y.max()
    if low < 0 or (num_classes is not None and high >= num_classes):
        valid = "0 up" if num_classes is None else f"0 to {num_classes - 1}"
        raise ValueError(f"y holds the label {low if low < 0 else high}, but labels are class "
                         f"indices from {valid}; JAX would take it for another class")


def split_batch(X, y, num_devices):
    """Split ``X`` and ``y`` into ``num_devices`` equal shards along a new leading axis."""
    d2l.check_labels(X, y)
    check_divisible(len(X), num_devices)
    return (X.reshape(num_devices, -1, *X.shape[1:]),
            y.reshape(num_devices, -1, *y.shape[1:]))


@functools.partial(jax.pmap, axis_name="devices", in_axes=(0, 0, 0, None))
def pmap_sgd_step(params, X, y, lr):
    """One SGD step on every device: local gradients, averaged with ``pmean``, same update."""
    loss, grads = jax.value_and_grad(d2l.loss_fn)(params, X, y)
    grads = lax.pmean(grads, axis_name="devices")   # the allreduce of data parallelism
    loss = lax.pmean(loss, axis_name="devices")
    return [p - lr * g for p, g in zip(params, grads)], loss


def train_batch(params, X, y, num_devices, lr):
    """Split a global batch over the devices and take one data-parallel SGD step."""
    X_shards, y_shards = split_batch(X, y, num_devices)
    return pmap_sgd_step(params, X_shards, y_shards, lr)


def check_finite_loss(loss, epoch, lr, batch_size):
    """Raise a FloatingPointError suggesting a smaller ``lr`` unless ``loss`` is finite."""
    if not math.isfinite(loss):
        raise FloatingPointError(f"the loss became {loss} in epoch {epoch} with lr={lr}, "
                                 f"too large for batch {batch_size}: try lr={lr / 10:g}")


def train(num_devices, batch_size, lr, num_epochs=10, data=None):
    """Train LeNet on ``num_devices`` devices; return unreplicated params and history."""
    devices = d2l.devices(num_devices)
    check_divisible(batch_size, num_devices)
    d2l.check_positive(lr=lr, num_epochs=num_epochs)
    data = data or d2l.FashionMNIST(batch_size)
    train_iter = data.get_dataloader(train=True, drop_last=True)
    params = d2l.replicate(d2l.init_lenet_params(jax.random.key(0)), devices)
    animator = d2l.Animator("epoch", "test acc", xlim=[1, num_epochs], ylim=[0, 1])
    timer, history = d2l.Timer(), []
    for epoch in range(num_epochs):
        timer.start()
        for X, y in train_iter:
            params, loss = train_batch(params, X, y, num_devices, lr)
        loss = float(loss[0])  # waits for the last step, so the timer sees all the work
        timer.stop()
        d2l.check_finite_loss(loss, epoch + 1, lr, batch_size)
        acc = d2l.evaluate_accuracy(d2l.unreplicate(params), data.get_dataloader(train=False))
        animator.add(epoch + 1, acc)
        history.append({"epoch": epoch + 1, "loss": loss, "test_acc": acc, "sec": timer.times[-1]})
    print(f"test acc: {acc:.2f}, {timer.avg():.1f} sec/epoch on {d2l.describe(devices)}")
    return d2l.unreplicate(params), history, animator
