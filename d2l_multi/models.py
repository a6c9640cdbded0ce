"""LeNet written by hand: parameters are a plain list of arrays, layers are ``lax`` calls.

Images are NHWC (batch, height, width, channels) and kernels HWIO, the layout XLA prefers on
CPU and GPU alike. ``conv2d`` is XLA's convolution; ``conv2d_im2col`` computes the same as one
matrix product over shifted slices (im2col), the formulation the appendix A1_fast_lenet_on_cpu
measures against it.
"""
from collections.abc import Iterable

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.typing import ArrayLike

from . import _checks as check
from ._earlier import models as d2l
from .errors import InputError


def init_lenet_params(key):
    """LeNet's [W1, b1, W2, b2, W3, b3, W4, b4], He init, kernels HWIO."""
    k1, k2, k3, k4 = jax.random.split(key, 4)
    he = jax.nn.initializers.he_normal()
    return [he(k1, (3, 3, 1, 20)), jnp.zeros(20),   # conv 3x3: 1 in, 20 out
            he(k2, (5, 5, 20, 50)), jnp.zeros(50),  # conv 5x5: 20 in, 50 out
            he(k3, (800, 128)), jnp.zeros(128),     # dense: 50*4*4 in, 128 out
            he(k4, (128, 10)), jnp.zeros(10)]       # dense: 128 in, 10 classes


def conv2d(X, W, b):
    """A 'valid' 2-D convolution of NHWC images with an HWIO kernel, plus b."""
    Y = lax.conv_general_dilated(X, W, window_strides=(1, 1), padding="VALID",
                                 dimension_numbers=("NHWC", "HWIO", "NHWC"))
    return Y + b


def avg_pool2d(X, size=2):
    """Average pooling over non-overlapping ``size x size`` windows (NHWC)."""
    window = (1, size, size, 1)
    sums = lax.reduce_window(X, 0.0, lax.add, window, window, "VALID")
    return sums / (size * size)


def conv2d_im2col(X, W, b):
    """The same convolution as one matrix product of shifted slices (im2col)."""
    kh, kw, cin, cout = W.shape
    oh, ow = X.shape[1] - kh + 1, X.shape[2] - kw + 1
    patches = jnp.concatenate([X[:, i:i + oh, j:j + ow, :]
                               for i in range(kh) for j in range(kw)], axis=-1)
    return patches @ W.reshape(kh * kw * cin, cout) + b


def lenet(params, X):
    """LeNet's forward pass: (batch, 28, 28, 1) images -> (batch, 10) logits."""
    W1, b1, W2, b2, W3, b3, W4, b4 = params
    h1 = avg_pool2d(jax.nn.relu(conv2d(X, W1, b1)))     # (batch, 13, 13, 20)
    h2 = avg_pool2d(jax.nn.relu(conv2d(h1, W2, b2)))    # (batch, 4, 4, 50)
    h2 = h2.reshape(h2.shape[0], -1)                    # (batch, 800)
    h3 = jax.nn.relu(h2 @ W3 + b3)                      # (batch, 128)
    return h3 @ W4 + b4                                 # (batch, 10)


def loss_fn(params, X, y):
    """Mean softmax cross-entropy of LeNet's logits against integer labels."""
    logits = lenet(params, X)
    return optax.softmax_cross_entropy(logits, jax.nn.one_hot(y, 10)).mean()


@jax.jit
def num_correct(params, X, y):
    """How many of LeNet's predictions for ``X`` equal the labels ``y``."""
    return (jnp.argmax(lenet(params, X), axis=1) == y).sum()


def evaluate_accuracy(params, data_iter):
    """LeNet's accuracy with ``params`` over the batches of ``data_iter``."""
    metric = d2l.Accumulator(2)  # number correct, number of examples
    for X, y in data_iter:
        metric.add(num_correct(params, X, y), y.size)
    return metric[0] / metric[1]


# The checks around the functions above, which the chapter shows without them.

Params = list[jax.Array]  # LeNet's [W1, b1, ..., W4, b4], or a copy per device stacked


def lenet_io(params: Params) -> tuple[int, int]:
    """The channels of the images and the classes LeNet's ``params`` take."""
    check.tree(params)
    leaves = jax.tree.leaves(params)
    return jnp.shape(leaves[0])[-2], jnp.shape(leaves[-1])[-1]


def check_batch(params: Params, X: ArrayLike, y: ArrayLike) -> None:
    """Refuse a batch LeNet's ``params`` cannot take: images not NHWC with its channels, a
    NaN or infinity in them, labels that are not its class indices."""
    channels, classes = lenet_io(params)
    check.examples(X, y)
    check.images(X, channels)
    check.finite_values(X)
    check.labels(y, classes)


def _check_key(key: jax.Array) -> None:
    if not isinstance(key, jax.Array):
        raise InputError(f"key must be a JAX random key, e.g. jax.random.key(0), got {key!r}")


def _check_conv(X: ArrayLike, W: ArrayLike, b: ArrayLike) -> None:
    check.images(X)
    if jnp.ndim(W) != 4 or jnp.shape(W)[2] != jnp.shape(X)[3]:
        raise InputError(f"W has shape {jnp.shape(W)}; a kernel is HWIO (height, width, "
                         f"{jnp.shape(X)[3]} input channels as X has, output channels)")
    _check_window(X, jnp.shape(W)[:2], "the kernel")
    if jnp.shape(b) not in ((), jnp.shape(W)[3:]):
        raise InputError(f"b has shape {jnp.shape(b)}; pass one bias per output channel, "
                         f"shape {jnp.shape(W)[3:]}, or one for all")


def _check_window(X, window, what):
    if any(w > x for w, x in zip(window, jnp.shape(X)[1:3])):
        raise InputError(f"{what} ({window[0]} x {window[1]}) is larger than the images "
                         f"({jnp.shape(X)[1]} x {jnp.shape(X)[2]}): nothing would be left")


def _check_pool(X: ArrayLike, size: int = 2) -> None:
    check.images(X)
    check.integer(1, size=size)
    _check_window(X, (size, size), "the pooling window")


def _check_lenet(params: Params, X: ArrayLike) -> None:
    check.images(X, lenet_io(params)[0])


def _check_evaluate(params: Params, data_iter: Iterable[tuple[ArrayLike, ArrayLike]]) -> None:
    check.tree(params)
    if hasattr(data_iter, "__len__"):
        check.nonempty(data_iter=data_iter)


init_lenet_params = check.validated(init_lenet_params, _check_key)
conv2d = check.validated(conv2d, _check_conv)
conv2d_im2col = check.validated(conv2d_im2col, _check_conv)
avg_pool2d = check.validated(avg_pool2d, _check_pool)
lenet = check.validated(lenet, _check_lenet)
loss_fn = check.validated(loss_fn, check_batch)
num_correct = check.validated(num_correct, check_batch)
evaluate_accuracy = check.validated(check.some_batches(evaluate_accuracy), _check_evaluate)
