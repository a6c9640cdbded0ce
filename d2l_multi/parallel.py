"""Data parallelism from scratch: split a batch over the devices, a pmapped SGD step whose
gradients are averaged with ``lax.pmean``, and LeNet trained on 1 or N devices."""
import functools
import math
from typing import Any

import jax
from jax import lax
from jax.typing import ArrayLike

from . import _checks as check
from ._earlier import parallel as d2l
from .errors import DivergedError, InputError
from .models import Params, check_batch, lenet_io


def split_batch(X, y, num_devices):
    """Split X and y into num_devices equal shards along a new axis 0."""
    return (X.reshape(num_devices, -1, *X.shape[1:]),
            y.reshape(num_devices, -1, *y.shape[1:]))


def device_sgd_step(params, X, y, lr):
    """One device's SGD step: its local gradient, averaged over the devices."""
    loss, grads = jax.value_and_grad(d2l.loss_fn)(params, X, y)
    grads = lax.pmean(grads, axis_name="devices")  # the allreduce
    loss = lax.pmean(loss, axis_name="devices")
    return [p - lr * g for p, g in zip(params, grads)], loss


pmap_sgd_step = jax.pmap(device_sgd_step, axis_name="devices",
                         in_axes=(0, 0, 0, None))


def train_batch(params, X, y, num_devices, lr):
    """Split a global batch over the devices and take one data-parallel step."""
    X_shards, y_shards = split_batch(X, y, num_devices)
    return pmap_sgd_step(params, X_shards, y_shards, lr)


def _check_finite_loss(loss, epoch, lr, batch_size):
    if not math.isfinite(loss):
        raise DivergedError(f"the loss became {loss} in epoch {epoch} with lr={lr:g}, "
                            f"too large for batch {batch_size}: lower lr by factors of "
                            f"10 until the loss stays finite")


def train(num_devices, batch_size, lr, num_epochs=10, data=None):
    """Train LeNet on ``num_devices`` devices; return params, history, plot."""
    devices = d2l.devices(num_devices)
    data = data or d2l.FashionMNIST(batch_size)
    train_iter = data.get_dataloader(train=True, drop_last=True)
    test_iter = data.get_dataloader(train=False)
    params = d2l.replicate(d2l.init_lenet_params(jax.random.key(0)), devices)
    animator = d2l.Animator("epoch", "test acc", xlim=[1, num_epochs],
                            ylim=[0, 1])
    timer, history = d2l.Timer(), []
    for epoch in range(num_epochs):
        timer.start()
        for X, y in train_iter:
            params, loss = train_batch(params, X, y, num_devices, lr)
        loss = float(loss[0])  # waits for the last step: the timer sees it all
        timer.stop()
        acc = d2l.evaluate_accuracy(d2l.unreplicate(params), test_iter)
        animator.add(epoch + 1, acc)
        history.append({"epoch": epoch + 1, "loss": loss, "test_acc": acc,
                        "sec": timer.times[-1]})
    print(f"test acc: {acc:.3f}, {timer.avg():.1f} sec/epoch on "
          f"{d2l.describe(devices)}")
    return d2l.unreplicate(params), history, animator


# The checks around the functions above, which the chapter shows without them.

def _check_split_batch(X: ArrayLike, y: ArrayLike, num_devices: int) -> None:
    check.examples(X, y)
    check.labels(y)
    check.divisible(len(X), num_devices)


def _check_device_step(params: Params, X: ArrayLike, y: ArrayLike, lr: float) -> None:
    check_batch(params, X, y)
    check.positive(lr=lr)


def _check_pmap_step(params: Params, X: ArrayLike, y: ArrayLike, lr: float) -> None:
    channels, classes = lenet_io(params)
    check.examples(X, y)
    check.images(X, channels, stacked=1)
    check.labels(y, classes, stacked=1)
    check.positive(lr=lr)


def _check_train_batch(params: Params, X: ArrayLike, y: ArrayLike, num_devices: int,
                       lr: float) -> None:
    check_batch(params, X, y)
    check.divisible(len(X), num_devices)
    check.positive(lr=lr)


def _check_train(num_devices: int, batch_size: int, lr: float, num_epochs: int = 10,
                 data: Any = None) -> None:
    """Refuse a batch that does not divide, a bad ``lr`` or number of epochs, and data
    LeNet cannot take (checked whole, before training: a label out of range would silently
    count for nothing)."""
    check.positive(batch_size=batch_size, lr=lr, num_epochs=num_epochs)
    check.divisible(batch_size, num_devices)
    for split in ("train", "val"):
        arrays = getattr(data, split, None)
        if isinstance(arrays, tuple) and len(arrays) == 2:
            X, y = arrays
            check.examples(X, y, (f"data.{split}[0]", f"data.{split}[1]"))
            check.images(X, 1, f"data.{split}[0]")
            check.finite_values(X, f"data.{split}[0]")
            check.labels(y, 10, f"data.{split}[1]")
    if data is not None and not hasattr(data, "get_dataloader"):
        raise InputError(f"data must be a data module such as d2l.FashionMNIST({batch_size}), "
                         f"got {type(data).__name__}")
    given = getattr(data, "batch_size", batch_size)
    if given != batch_size:
        raise InputError(f"batch_size={batch_size} but data makes batches of {given}; pass "
                         f"batch_size={given}, or data=d2l.FashionMNIST({batch_size})")


def _stops_on_divergence(train):
    """``train`` that raises a DivergedError naming the first epoch whose loss is not
    finite (a learning rate too large for the batch)."""
    @functools.wraps(train)
    def checked(num_devices, batch_size, lr, num_epochs=10, data=None):
        params, history, animator = train(num_devices, batch_size, lr, num_epochs, data)
        for record in history:
            _check_finite_loss(record["loss"], record["epoch"], lr, batch_size)
        return params, history, animator
    return checked


split_batch = check.validated(split_batch, _check_split_batch)
device_sgd_step = check.validated(device_sgd_step, _check_device_step)
pmap_sgd_step = check.validated(pmap_sgd_step, _check_pmap_step)
train_batch = check.validated(train_batch, _check_train_batch)
train = check.validated(_stops_on_divergence(train), _check_train)
