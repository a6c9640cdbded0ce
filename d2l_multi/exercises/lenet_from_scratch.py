"""The checks of the exercises of notebook 01_lenet_from_scratch."""
import math

import numpy as np

from ._common import _call, _close, _exercise, _fail, _near, _same_structure, _scale

# --------------------------------------------------------------------------------------------
# 01: LeNet from scratch

def _log_softmax_loss(logits, y):
    logits = np.asarray(logits, np.float64)
    z = logits - logits.max(axis=1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
    return -logp[np.arange(len(y)), y].mean()


@_exercise("01_lenet_from_scratch")
def cross_entropy(cross_entropy, hidden=False):
    """``cross_entropy(logits, y)``: the mean softmax cross-entropy of (batch, classes) logits
    against integer labels, finite even for large logits."""
    import jax.numpy as jnp
    rng = np.random.default_rng(1)
    cases = [(8, 10, 3.0), (8, 10, 1000.0)]
    if hidden:
        cases += [(5, 3, 1.0), (16, 4, -800.0)]
    for n, c, scale in cases:
        logits = rng.normal(size=(n, c)).astype(np.float32) * abs(scale)
        logits[:, 0] += np.sign(scale) * abs(scale)
        y = rng.integers(0, c, size=n)
        got = _call(cross_entropy, "cross_entropy", jnp.asarray(logits), jnp.asarray(y))
        if np.shape(got) != ():
            _fail(f"returned shape {np.shape(got)}: return one number, the mean over the "
                  f"batch")
        got = float(got)
        want = _log_softmax_loss(logits, y)
        if not math.isfinite(got):
            _fail(f"your loss is {got} for logits of size ~{abs(scale):g}: exp overflows in "
                  f"float32; subtract each row's largest logit first (what jax.nn.log_softmax "
                  f"does)")
        if _close(got, want, rtol=1e-4, atol=1e-4):
            continue
        if _close(got, want * n, rtol=1e-4):
            _fail(f"your loss is {n}\u00d7 too large (the batch size): average over the "
                  f"examples instead of summing")
        if _close(got, -want, rtol=1e-4):
            _fail("your loss has the wrong sign: it is minus the log-probability of the label")
        z = logits.astype(np.float64) - logits.max(axis=0, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=0, keepdims=True))  # over the batch: a mistake
        if _close(got, -logp[np.arange(n), y].mean(), rtol=1e-4):
            _fail("you normalised over the batch axis (0): the softmax runs over the classes "
                  "(the last axis)")
        _fail(f"your loss is {got:.4g} where the mean cross-entropy is {want:.4g} "
              f"(batch {n}, {c} classes)")
    return "the mean cross-entropy, finite even for logits of 1000"


@_exercise("01_lenet_from_scratch")
def sgd_update(sgd, hidden=False):
    """``sgd(params, grads, lr)``: one SGD step on any pytree of parameters."""
    rng = np.random.default_rng(2)
    trees = [[rng.normal(size=(3, 2)), rng.normal(size=2)]]
    if hidden:
        trees.append({"w": rng.normal(size=(4,)), "b": [rng.normal(size=(2, 2))]})
    import jax
    for params in trees:
        params = jax.tree.map(lambda a: np.asarray(a, np.float32), params)
        grads = jax.tree.map(lambda a: np.ones_like(a) * 0.5 + a, params)
        want = jax.tree.map(lambda p, g: p - 0.1 * g, params, grads)
        got = _call(sgd, "sgd", params, grads, 0.1)
        _same_structure(got, want, "the new parameters")
        r = _scale(jax.tree.map(lambda a, p: np.asarray(a) - p, got, params),
                   jax.tree.map(lambda a, p: a - p, want, params))
        if _near(r, -1):
            _fail("your step climbs the loss: subtract lr \u00d7 gradient")
        if _near(r, 10):
            _fail("your step ignores the learning rate: multiply the gradient by lr")
        if r is None or not _near(r, 1):
            _fail("some parameters moved by the wrong amount: every array p becomes "
                  "p - lr * g (jax.tree.map applies that to each)")
    return "every parameter moves by -lr \u00d7 its gradient"
