"""The checks of the exercises of notebook 08_ensembles."""
import numpy as np

from ._common import _call, _close, _exercise, _fail, _observe

# --------------------------------------------------------------------------------------------
# 08: ensembles


@_exercise("08_ensembles", cases=[(4, 6, 3)],
           passed="the mean of the members' probabilities (jax.nn.softmax of each)")
def ensemble_average(ensemble_probs, case):
    """``ensemble_probs(logits)``: logits of shape (members, batch, classes) -> the ensemble's
    class probabilities (batch, classes), the average of the members' probabilities."""
    import jax
    m, n, c = case
    rng = np.random.default_rng(m * n * c)
    logits = rng.normal(size=(m, n, c)).astype(np.float32) * 3
    logits[0] *= 10  # one confident member: averaging logits and probabilities differ

    def probe():
        import jax.numpy as jnp
        return np.asarray(_call(ensemble_probs, "ensemble_probs", jnp.asarray(logits)),
                          np.float64)
    got = _observe(probe)
    members = [np.asarray(jax.nn.softmax(member, axis=-1), np.float64) for member in logits]
    want = sum(members) / m
    if got.shape == (m, c):
        _fail(f"you averaged over the examples (axis 1): average over the members (axis 0), "
              f"giving shape ({n}, {c})")
    if got.shape != (n, c):
        _fail(f"returned shape {got.shape}: one row of probabilities per example, ({n}, {c})")
    if _close(got, want, rtol=1e-4, atol=1e-6):
        return
    mean_logits = logits.mean(0)
    if _close(got, mean_logits, rtol=1e-4):
        _fail("you averaged the logits and stopped: average the members' probabilities "
              "(softmax first), so each row sums to 1")
    if _close(got, np.asarray(jax.nn.softmax(mean_logits, axis=-1)), rtol=1e-4):
        _fail("you averaged the logits, then took the softmax: average the members' "
              "probabilities (softmax first, then the mean)")
    if not _close(got.sum(-1), 1.0, rtol=1e-4):
        _fail("the rows do not sum to 1: return probabilities")
    _fail("the probabilities are not the average of the members' probabilities")
