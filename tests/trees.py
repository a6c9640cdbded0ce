"""Comparing pytrees of arrays in tests: the tolerance the chapter's equivalence proofs use."""
import jax
import numpy as np

SGD_TOL = dict(rtol=1e-5, atol=1e-6)  # float32 SGD steps whose sums run in another order


def assert_trees_close(a, b, tol=SGD_TOL):
    """Assert ``a`` and ``b`` have as many leaves and every pair is allclose(**tol)."""
    leaves_a, leaves_b = jax.tree.leaves(a), jax.tree.leaves(b)
    assert len(leaves_a) == len(leaves_b)
    for u, v in zip(leaves_a, leaves_b):
        np.testing.assert_allclose(np.asarray(u), np.asarray(v), **tol)
