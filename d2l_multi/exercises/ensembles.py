"""The checks of the exercises of notebook 08_ensembles."""
import numpy as np

from ._common import _call, _close, _exercise, _fail

# --------------------------------------------------------------------------------------------
# 08: ensembles

@_exercise("08_ensembles")
def ensemble_average(ensemble_probs, hidden=False):
    """``ensemble_probs(logits)``: logits of shape (members, batch, classes) -> the ensemble's
    class probabilities (batch, classes), the average of the members' probabilities."""
    import jax.numpy as jnp
    cases = [(4, 6, 3)] + ([(8, 5, 10), (2, 16, 2)] if hidden else [])
    for m, n, c in cases:
        rng = np.random.default_rng(m * n * c)
        logits = rng.normal(size=(m, n, c)).astype(np.float32) * 3
        logits[0] *= 10  # one confident member: averaging logits and probabilities differ
        got = np.asarray(_call(ensemble_probs, "ensemble_probs", jnp.asarray(logits)),
                         np.float64)
        z = logits - logits.max(-1, keepdims=True)
        probs = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
        want = probs.mean(0)
        if got.shape == (m, c):
            _fail(f"you averaged over the examples (axis 1): average over the members "
                  f"(axis 0), giving shape ({n}, {c})")
        if got.shape != (n, c):
            _fail(f"returned shape {got.shape}: one row of probabilities per example, "
                  f"({n}, {c})")
        if _close(got, want, rtol=1e-4, atol=1e-6):
            continue
        mean_logits = logits.mean(0)
        if _close(got, mean_logits, rtol=1e-4):
            _fail("you averaged the logits and stopped: average the members' probabilities "
                  "(softmax first), so each row sums to 1")
        z = mean_logits - mean_logits.max(-1, keepdims=True)
        if _close(got, np.exp(z) / np.exp(z).sum(-1, keepdims=True), rtol=1e-4):
            _fail("you averaged the logits, then took the softmax: average the members' "
                  "probabilities (softmax first, then the mean)")
        if not _close(got.sum(-1), 1.0, rtol=1e-4):
            _fail("the rows do not sum to 1: return probabilities")
        _fail("the probabilities are not the average of the members' probabilities")
    return "the mean of the members' softmax probabilities"
