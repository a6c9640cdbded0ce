"""Comparing pytrees of arrays in tests: the tolerance the chapter's equivalence proofs use."""
import jax
import numpy as np


def cnn_from_linen(params):
    """An NNX ``d2l.CNN`` holding ``d2l.LinenCNN``'s ``params``, matched by name: the two
    recipes start from the same parameters."""
    from flax import nnx

    import d2l_multi as d2l
    layers = {"conv1": "Conv_0", "conv2": "Conv_1", "dense1": "Dense_0", "dense2": "Dense_1"}
    model = nnx.eval_shape(lambda: d2l.CNN(rngs=nnx.Rngs(0)))  # no values drawn
    nnx.update(model, {new: dict(params[old]) for new, old in layers.items()})
    return model


def image_batches(batch, count, seed=1):
    """``count`` batches of ``batch`` random 28 x 28 images (NHWC) and labels 0..9."""
    rng = np.random.default_rng(seed)
    return [(rng.random((batch, 28, 28, 1), dtype=np.float32),
             rng.integers(0, 10, batch).astype(np.int32)) for _ in range(count)]


SGD_TOL = dict(rtol=1e-5, atol=1e-6)  # float32 SGD steps whose sums run in another order


def assert_trees_close(a, b, tol=SGD_TOL):
    """Assert ``a`` and ``b`` have as many leaves and every pair is allclose(**tol)."""
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(leaves_a) == len(leaves_b)
    for u, v in zip(leaves_a, leaves_b):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), **tol)
