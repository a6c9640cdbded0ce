"""The checks of the exercises of notebook 04a_jit_and_shardings."""
from ._common import (
    _call,
    _close,
    _exercise,
    _fail,
    _mesh,
    _reference_step,
    _run,
    _softmax_loss,
    _softmax_problem,
)

# --------------------------------------------------------------------------------------------
# 04a: jit and shardings

@_exercise("04a_jit_and_shardings")
def jit_data_parallel(place, hidden=False):
    """``place(params, X, y, mesh)``: the parameters replicated, the batch split along its
    first axis over the mesh's 'data' axis, so that ``jax.jit`` runs the step data parallel."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    step = jax.jit(lambda p, X, y: [a - 0.1 * g for a, g in
                                    zip(p, jax.grad(_softmax_loss)(p, X, y))])
    for k, n in [(8, 32)] + ([(4, 8)] if hidden else []):
        mesh = _mesh((k,), ("data",))
        params, X, y = _softmax_problem(n, n, features=8, classes=8)
        out = _call(place, "place", params, X, y, mesh)
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            _fail("return three things: (params, X, y) laid out on the mesh")
        p, Xs, ys = out
        for what, arrays in [("the parameters", jax.tree.leaves(p)), ("X", [Xs]), ("y", [ys])]:
            if not all(isinstance(a, jax.Array) for a in arrays):
                _fail(f"{what} are still host arrays: place them with jax.device_put")
            if not all(len(a.sharding.device_set) == k for a in arrays):
                _fail(f"{what} are not on all {k} devices of the mesh")

        def split(a, axis):
            return a.sharding.shard_shape(a.shape)[axis] < a.shape[axis]
        if any(split(a, ax) for a in jax.tree.leaves(p) for ax in range(a.ndim)):
            _fail("your parameters are split over the devices: each device needs all of them "
                  "(replicate them with P())")
        if Xs.ndim > 1 and split(Xs, 1) and not split(Xs, 0):
            _fail("you split X along axis 1 (its features): split the batch axis, 0")
        if not split(Xs, 0):
            _fail("every device holds the whole batch X: shard it over 'data' along axis 0")
        if not split(ys, 0):
            _fail("y is replicated while X is split: shard y over 'data' too")
        if not Xs.sharding.is_equivalent_to(NamedSharding(mesh, P("data")), Xs.ndim):
            _fail("X is split, but not by the mesh's 'data' axis in device order")
        got = _run(step, p, Xs, ys, name="the step on your layout")
        want = _reference_step(params, X, y, 0.1)
        if not all(_close(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(got, want)):
            _fail("the step on your layout differs from one device's step")
    return "parameters replicated, batch split over 'data': jit's step equals one device's"
