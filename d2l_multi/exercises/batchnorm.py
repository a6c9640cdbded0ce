"""The checks of the exercises of notebook 05b_batchnorm."""
import numpy as np

from ._common import _call, _close, _exercise, _fail, _mesh, _observe, _run

# --------------------------------------------------------------------------------------------
# 05b: batch normalization


@_exercise("05b_batchnorm", cases=[(8, 4)],
           passed="the global batch's mean and variance on every device")
def batch_stats(batch_stats, case):
    """``batch_stats(x, axis_name)``, per device on its (m, features) examples: the mean and
    variance of the global batch, the same on every device."""
    k, m = case
    rng = np.random.default_rng(k * m)
    x = (rng.normal(size=(k, m, 3)) + 3 * np.arange(k)[:, None, None]).astype(np.float32)

    def probe():
        import jax
        import jax.numpy as jnp
        from jax.sharding import PartitionSpec as P
        mesh = _mesh((k,), ("data",))

        def local(block):
            out = _call(batch_stats, "batch_stats", block[0], "data")
            if not isinstance(out, (tuple, list)) or len(out) != 2:
                _fail("return two arrays, (mean, var)")
            return tuple(jnp.asarray(a)[None] for a in out)
        program = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=P("data"),
                                        out_specs=P("data"), check_vma=False))
        return tuple(np.asarray(a, np.float64) for a in _run(program, x, name="batch_stats"))
    mean, var = _observe(probe)
    flat = x.reshape(k * m, 3).astype(np.float64)
    if mean.shape != (k, 3) or var.shape != (k, 3):
        _fail(f"mean and var should have one value per feature, shape (3,); got "
              f"{mean.shape[1:]} and {var.shape[1:]}")
    local_mean = x.mean(axis=1)
    if _close(mean, local_mean, rtol=1e-4):
        _fail(f"each device's mean is that of its own {m} examples: BatchNorm across devices "
              f"needs the global batch's mean (pmean of the local means)")
    if _close(mean, local_mean.sum(0, keepdims=True).repeat(k, 0), rtol=1e-4):
        _fail(f"the mean is {k}\u00d7 too large: psum adds the {k} local means; pmean averages "
              f"them")
    if not _close(mean, np.broadcast_to(flat.mean(0), (k, 3)), rtol=1e-4, atol=1e-5):
        _fail("the mean is not the global batch's mean")
    if _close(var, np.broadcast_to(x.var(axis=1).mean(0), (k, 3)), rtol=1e-4):
        _fail("your variance misses the spread between the devices' means: average E[x\u00b2] "
              "(or the squared deviations from the global mean) over the devices, not the "
              "local variances")
    if _close(var, x.var(axis=1), rtol=1e-4):
        _fail("each device's variance is that of its own examples: average over the devices "
              "too")
    if not _close(var, np.broadcast_to(flat.var(0), (k, 3)), rtol=1e-3, atol=1e-4):
        _fail("the variance is not the global batch's variance")
