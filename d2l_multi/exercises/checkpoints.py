"""The checks of the exercises of notebook 10a_checkpoints."""
from ._common import _call, _exercise, _fail, _mesh, _observe

# --------------------------------------------------------------------------------------------
# 10a: checkpoints

_SPECS = {"w": ("P(None, 'data')", (None, "data")), "b": ("P()", ()), "step": ("P()", ())}


def _describe(target, tree, mesh, k):
    """What ``restore_target`` returned, leaf by leaf, as plain data."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    if jax.tree.structure(target) != jax.tree.structure(tree):
        return {"structure": False}
    leaves = {}
    for name in tree:
        t, a = target[name], tree[name]
        if isinstance(t, jax.Array):
            leaves[name] = {"kind": "array"}
        elif not isinstance(t, jax.ShapeDtypeStruct):
            leaves[name] = {"kind": type(t).__name__}
        else:
            sharding = t.sharding
            leaves[name] = {
                "kind": "struct", "shape": tuple(t.shape), "dtype": str(t.dtype),
                "sharded": sharding is not None,
                "devices": None if sharding is None else int(sharding.mesh.devices.size),
                "by_spec": sharding is not None and sharding.is_equivalent_to(
                    NamedSharding(mesh, P(*_SPECS[name][1])), a.ndim)}
    return {"structure": True, "leaves": leaves}


@_exercise("10a_checkpoints", cases=[4], passed="shapes, dtypes and the new mesh's shardings, no "
                                                "data")
def restore_target(restore_target, k):
    """``restore_target(tree, mesh, specs)``: the target to restore ``tree`` onto ``mesh``: for
    each array, its shape, dtype and a NamedSharding on ``mesh`` by its spec -- no data."""
    saved = {"w": ((8, 4), "float32"), "b": ((4,), "bfloat16"), "step": ((), "int32")}

    def probe():
        import jax
        import jax.numpy as jnp
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P
        saved_mesh = _mesh((8,), ("data",))
        tree = {name: jnp.zeros(shape, dtype) for name, (shape, dtype) in saved.items()}
        tree = jax.device_put(tree, {"w": NamedSharding(saved_mesh, P("data")),
                                     "b": NamedSharding(saved_mesh, P()),
                                     "step": NamedSharding(saved_mesh, P())})
        specs = {name: P(*spec) for name, (_, spec) in _SPECS.items()}
        mesh = _mesh((k,), ("data",))
        return _describe(_call(restore_target, "restore_target", tree, mesh, specs), tree,
                         mesh, k)
    seen = _observe(probe)
    if not seen["structure"]:
        _fail("the target should have the structure of the saved tree")
    for name, (shape, dtype) in saved.items():
        t = seen["leaves"][name]
        if t["kind"] == "array":
            _fail("you returned arrays: a target only describes each array "
                  "(jax.ShapeDtypeStruct: shape, dtype, sharding); allocating them first costs "
                  "the memory twice")
        if t["kind"] != "struct":
            _fail(f"'{name}' is a {t['kind']}: describe it with jax.ShapeDtypeStruct(shape, "
                  f"dtype, sharding=...)")
        if tuple(t["shape"]) != shape or t["dtype"] != dtype:
            _fail(f"'{name}' is {t['dtype']}{list(t['shape'])} in your target but "
                  f"{dtype}{list(shape)} in the checkpoint: keep shape and dtype")
        if not t["sharded"]:
            _fail(f"'{name}' has no sharding: Orbax would not know where to put it; give it a "
                  f"NamedSharding on the new mesh")
        if t["devices"] != k:
            _fail(f"'{name}' is laid out on the {t['devices']}-device mesh it was saved from, "
                  f"not the {k}-device mesh you restore on")
        if not t["by_spec"]:
            _fail(f"'{name}' is not laid out by its spec {_SPECS[name][0]} on the new mesh")
