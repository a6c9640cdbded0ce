"""The checks of the exercises of notebook 04a_jit_and_shardings."""
from ._common import (
    _call,
    _close,
    _exercise,
    _fail,
    _mesh,
    _observe,
    _reference_step,
    _run,
    _softmax_loss,
    _softmax_problem,
    _tree,
)

# --------------------------------------------------------------------------------------------
# 04a: jit and shardings


def _layout(a):
    """How a placed array is laid out, as plain data."""
    import jax
    if not isinstance(a, jax.Array):
        return {"host": True}
    return {"host": False, "devices": len(a.sharding.device_set), "shape": tuple(a.shape),
            "shard": tuple(a.sharding.shard_shape(a.shape))}


@_exercise("04a_jit_and_shardings", cases=[(8, 32)],
           passed="parameters replicated, batch split over 'data': jit's step equals one "
                  "device's")
def jit_data_parallel(place, case):
    """``place(params, X, y, mesh)``: the parameters replicated, the batch split along its
    first axis over the mesh's 'data' axis, so that ``jax.jit`` runs the step data parallel."""
    k, n = case
    params, X, y = _softmax_problem(n, n, features=8, classes=8)

    def probe():
        import jax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P
        mesh = _mesh((k,), ("data",))
        out = _call(place, "place", params, X, y, mesh)
        if not isinstance(out, (tuple, list)) or len(out) != 3:
            return {"returned": type(out).__name__}
        p, Xs, ys = out
        seen = {"params": [_layout(a) for a in jax.tree.leaves(p)], "X": _layout(Xs),
                "y": _layout(ys)}
        if any(s["host"] for s in seen["params"] + [seen["X"], seen["y"]]):
            return seen
        seen["X_by_data"] = Xs.sharding.is_equivalent_to(NamedSharding(mesh, P("data")),
                                                         Xs.ndim)
        step = jax.jit(lambda p, X, y: [a - 0.1 * g for a, g in
                                        zip(p, jax.grad(_softmax_loss)(p, X, y))])
        seen["step"] = _tree(_run(step, p, Xs, ys, name="the step on your layout"))
        return seen
    seen = _observe(probe)
    if "returned" in seen:
        _fail("return three things: (params, X, y) laid out on the mesh")
    for what, layouts in [("the parameters", seen["params"]), ("X", [seen["X"]]),
                          ("y", [seen["y"]])]:
        if any(a["host"] for a in layouts):
            _fail(f"{what} are still host arrays: place them with jax.device_put")
        if not all(a["devices"] == k for a in layouts):
            _fail(f"{what} are not on all {k} devices of the mesh")

    def split(a, axis):
        return len(a["shape"]) > axis and a["shard"][axis] < a["shape"][axis]
    if any(split(a, ax) for a in seen["params"] for ax in range(len(a["shape"]))):
        _fail("your parameters are split over the devices: each device needs all of them "
              "(replicate them with P())")
    Xs, ys = seen["X"], seen["y"]
    if split(Xs, 1) and not split(Xs, 0):
        _fail("you split X along axis 1 (its features): split the batch axis, 0")
    if not split(Xs, 0):
        _fail("every device holds the whole batch X: shard it over 'data' along axis 0")
    if not split(ys, 0):
        _fail("y is replicated while X is split: shard y over 'data' too")
    if not seen["X_by_data"]:
        _fail("X is split, but not by the mesh's 'data' axis in device order")
    want = _reference_step(params, X, y, 0.1)
    got = seen["step"]
    if len(got) != len(want) or not all(_close(a, b, rtol=1e-4, atol=1e-5)
                                        for a, b in zip(got, want)):
        _fail("the step on your layout differs from one device's step")
