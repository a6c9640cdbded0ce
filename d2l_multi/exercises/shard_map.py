"""The checks of the exercises of notebook 04b_shard_map."""
import numpy as np

from ._common import (
    _call,
    _close,
    _exercise,
    _fail,
    _mesh,
    _near,
    _observe,
    _run,
    _same_structure,
    _scale,
    _softmax_grad,
    _softmax_loss,
    _softmax_problem,
    _times,
    _tree,
)

# --------------------------------------------------------------------------------------------
# 04b: shard_map


@_exercise("04b_shard_map", cases=[(8, 32)],
           passed="the whole batch's gradient, without the k-fold error")
def shard_map_grad(global_grad, case):
    """``global_grad(params, X, y, loss_fn)``, per device under ``jax.shard_map`` with
    ``check_vma=True`` over axis 'data' (params P(), X and y P('data'), output P()): the
    gradient of the whole batch's mean loss."""
    k, n = case
    params, X, y = _softmax_problem(3 * n, n)

    def probe():
        import jax
        from jax.sharding import PartitionSpec as P
        mesh = _mesh((k,), ("data",))
        program = jax.jit(jax.shard_map(
            lambda p, X, y: _call(global_grad, "global_grad", p, X, y, _softmax_loss),
            mesh=mesh, in_specs=(P(), P("data"), P("data")), out_specs=P()))
        return _tree(_run(program, params, X, y, name="global_grad"))
    got = _observe(probe)
    want = [np.asarray(g, np.float64) for g in _softmax_grad()(params, X, y)]
    _same_structure(got, want, "the gradient")
    got = [np.asarray(g, np.float64) for g in got]
    if all(_close(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(got, want)):
        return
    r = _scale(got, want)
    if _near(r, k):
        _fail(f"your gradient is {k}\u00d7 too large: with check_vma=True, the gradient of "
              f"replicated parameters is summed over the devices. Differentiate the mean of "
              f"the local losses (lax.pmean), not their sum, and do not reduce the gradient "
              f"again")
    if _near(r, 1 / k):
        _fail(f"your gradient is {k}\u00d7 too small: it was averaged twice")
    if r is not None:
        _fail(f"your gradient is {_times(r, 1)}")
    _fail("your gradient is not the whole batch's gradient (is it one device's own?)")
