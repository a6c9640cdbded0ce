"""Training LeNet data-parallel on 1 or N devices, timed per epoch and plotted."""
import math

import jax
import jax.numpy as jnp

import d2l_multi as d2l


@jax.jit
def num_correct(params, X, y):
    """How many of LeNet's predictions for ``X`` equal the labels ``y``."""
    return (jnp.argmax(d2l.lenet(params, X), axis=1) == y).sum()


def evaluate_accuracy(params, data_iter):
    """Accuracy of LeNet (unreplicated ``params``, on one device) over ``data_iter``."""
    metric = d2l.Accumulator(2)  # number correct, number of examples
    for X, y in data_iter:
        metric.add(num_correct(params, X, y), y.size)
    return metric[0] / metric[1]


def train(num_devices, batch_size, lr, num_epochs=10, data=None, conv=d2l.conv2d):
    """Train LeNet on ``num_devices`` devices; return unreplicated params and history."""
    devices = d2l.devices(num_devices)
    d2l.check_divisible(batch_size, num_devices)
    data = data or d2l.FashionMNIST(batch_size, num_train=d2l.pick(None, 4096),
                                    num_val=d2l.pick(None, 1024))
    params = d2l.replicate(d2l.init_lenet_params(jax.random.key(0)), devices)
    animator = d2l.Animator("epoch", "test acc", xlim=[1, num_epochs], ylim=[0, 1])
    timer, history = d2l.Timer(), []
    for epoch in range(num_epochs):
        timer.start()
        for i, (X, y) in enumerate(data.get_dataloader(True, batch_size, drop_last=True)):
            params, loss = d2l.throttle(d2l.train_batch(params, X, y, num_devices, lr, conv), i)
        loss = float(loss[0])  # waits for the last step, so the timer sees all the work
        timer.stop()
        if not math.isfinite(loss):
            raise FloatingPointError(
                f"the loss became {loss} in epoch {epoch + 1} with lr={lr}; the learning "
                f"rate is too large for batch {batch_size}: try lr={lr / 10:g}")
        acc = evaluate_accuracy(d2l.unreplicate(params),
                                data.get_dataloader(False, batch_size))
        animator.add(epoch + 1, acc)
        history.append({"epoch": epoch + 1, "loss": loss, "test_acc": acc,
                        "sec": timer.times[-1]})
    print(f"test acc: {acc:.2f}, {timer.avg():.1f} sec/epoch on {d2l.describe(devices)}")
    return d2l.unreplicate(params), history, animator
