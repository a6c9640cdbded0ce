"""The checks of the exercises of notebook 10a_checkpoints."""
from ._common import _call, _exercise, _fail, _mesh

# --------------------------------------------------------------------------------------------
# 10a: checkpoints

@_exercise("10a_checkpoints")
def restore_target(restore_target, hidden=False):
    """``restore_target(tree, mesh, specs)``: the target to restore ``tree`` onto ``mesh``: for
    each array, its shape, dtype and a NamedSharding on ``mesh`` by its spec -- no data."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    saved_mesh = _mesh((8,), ("data",))
    tree = {"w": jnp.zeros((8, 4), jnp.float32), "b": jnp.zeros(4, jnp.bfloat16),
            "step": jnp.zeros((), jnp.int32)}
    tree = jax.device_put(tree, {"w": NamedSharding(saved_mesh, P("data")),
                                 "b": NamedSharding(saved_mesh, P()),
                                 "step": NamedSharding(saved_mesh, P())})
    specs = {"w": P(None, "data"), "b": P(), "step": P()}
    for k in [4] + ([2] if hidden else []):
        mesh = _mesh((k,), ("data",))
        target = _call(restore_target, "restore_target", tree, mesh, specs)
        if jax.tree.structure(target) != jax.tree.structure(tree):
            _fail("the target should have the structure of the saved tree")
        for name in tree:
            t, a = target[name], tree[name]
            if isinstance(t, jax.Array):
                _fail("you returned arrays: a target only describes each array "
                      "(jax.ShapeDtypeStruct: shape, dtype, sharding); allocating them first "
                      "costs the memory twice")
            if not isinstance(t, jax.ShapeDtypeStruct):
                _fail(f"'{name}' is a {type(t).__name__}: describe it with "
                      f"jax.ShapeDtypeStruct(shape, dtype, sharding=...)")
            if t.shape != a.shape or t.dtype != a.dtype:
                _fail(f"'{name}' is {t.dtype}{list(t.shape)} in your target but "
                      f"{a.dtype}{list(a.shape)} in the checkpoint: keep shape and dtype")
            if t.sharding is None:
                _fail(f"'{name}' has no sharding: Orbax would not know where to put it; give "
                      f"it a NamedSharding on the new mesh")
            if t.sharding.mesh.devices.size != k:
                _fail(f"'{name}' is laid out on the {t.sharding.mesh.devices.size}-device mesh "
                      f"it was saved from, not the {k}-device mesh you restore on")
            if not t.sharding.is_equivalent_to(NamedSharding(mesh, specs[name]), a.ndim):
                _fail(f"'{name}' is not laid out by its spec {specs[name]} on the new mesh")
    return "shapes, dtypes and the new mesh's shardings, no data"
