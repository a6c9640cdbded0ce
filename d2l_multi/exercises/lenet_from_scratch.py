"""The checks of the exercises of notebook 01_lenet_from_scratch."""
import math

import numpy as np

from ._common import _call, _close, _exercise, _fail, _near, _observe, _scale, _tree

# --------------------------------------------------------------------------------------------
# 01: LeNet from scratch


def _optax_cross_entropy(logits, y):
    """The mean cross-entropy as optax computes it."""
    import optax
    return float(optax.softmax_cross_entropy_with_integer_labels(logits, y).mean())


@_exercise("01_lenet_from_scratch", cases=[(8, 10, 3.0), (8, 10, 1000.0)],
           passed="the mean cross-entropy of optax, finite even for logits of 1000")
def cross_entropy(cross_entropy, case):
    """``cross_entropy(logits, y)``: the mean softmax cross-entropy of (batch, classes) logits
    against integer labels, finite even for large logits."""
    n, c, scale = case
    rng = np.random.default_rng([n, c, int(abs(scale))])
    logits = rng.normal(size=(n, c)).astype(np.float32) * abs(scale)
    logits[:, 0] += np.sign(scale) * abs(scale)
    y = rng.integers(0, c, size=n).astype(np.int32)

    def probe():
        import jax.numpy as jnp
        return np.asarray(_call(cross_entropy, "cross_entropy", jnp.asarray(logits),
                                jnp.asarray(y)), np.float64)
    got = _observe(probe)
    if np.shape(got) != ():
        _fail(f"returned shape {np.shape(got)}: return one number, the mean over the batch")
    got = float(got)
    want = _optax_cross_entropy(logits, y)
    if not math.isfinite(got):
        _fail(f"your loss is {got} for logits of size ~{abs(scale):g}: exp overflows in "
              f"float32; subtract each row's largest logit first (what jax.nn.log_softmax "
              f"does)")
    if _close(got, want, rtol=1e-4, atol=1e-4):
        return
    if _close(got, want * n, rtol=1e-4):
        _fail(f"your loss is {n}\u00d7 too large (the batch size): average over the examples "
              f"instead of summing")
    if _close(got, -want, rtol=1e-4):
        _fail("your loss has the wrong sign: it is minus the log-probability of the label")
    z = logits.astype(np.float64) - logits.max(axis=0, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=0, keepdims=True))  # over the batch: a mistake
    if _close(got, -logp[np.arange(n), y].mean(), rtol=1e-4):
        _fail("you normalised over the batch axis (0): the softmax runs over the classes (the "
              "last axis)")
    _fail(f"your loss is {got:.4g} where optax's mean cross-entropy is {want:.4g} (batch {n}, "
          f"{c} classes)")


def _sgd_tree(case):
    rng = np.random.default_rng(2 if case == "list" else 3)
    if case == "list":
        return [rng.normal(size=(3, 2)).astype(np.float32),
                rng.normal(size=2).astype(np.float32)]
    return {"w": rng.normal(size=(4,)).astype(np.float32),
            "b": [rng.normal(size=(2, 2)).astype(np.float32)]}


@_exercise("01_lenet_from_scratch", cases=["list"],
           passed="every parameter moves as optax.sgd moves it")
def sgd_update(sgd, case):
    """``sgd(params, grads, lr)``: one SGD step on any pytree of parameters."""
    import jax
    params = _sgd_tree(case)
    grads = jax.tree.map(lambda a: np.ones_like(a) * 0.5 + a, params)
    got = _observe(lambda: _tree(_call(sgd, "sgd", params, grads, 0.1)))
    import optax
    updates, _ = optax.sgd(0.1).update(grads, optax.sgd(0.1).init(params))
    want = optax.apply_updates(params, updates)
    gs = [np.shape(x) for x in jax.tree.leaves(got)]
    ws = [np.shape(x) for x in jax.tree.leaves(want)]
    if jax.tree.structure(got) != jax.tree.structure(want) or gs != ws:
        _fail(f"returned {len(gs)} arrays of shapes {gs}: return the new parameters with the "
              f"structure and shapes of the parameters ({ws})")
    r = _scale(jax.tree.map(lambda a, p: np.asarray(a) - p, got, params),
               jax.tree.map(lambda a, p: np.asarray(a) - p, want, params))
    if _near(r, -1):
        _fail("your step climbs the loss: subtract lr \u00d7 gradient")
    if _near(r, 10):
        _fail("your step ignores the learning rate: multiply the gradient by lr")
    if r is None or not _near(r, 1):
        _fail("some parameters moved by the wrong amount: every array p becomes p - lr * g "
              "(jax.tree.map applies that to each)")
