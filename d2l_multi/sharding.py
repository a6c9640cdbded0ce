"""Logical sharding of NNX models: rules map the logical axis names on a model's parameters to
the axes of a device mesh; check them, create the model directly in its sharded layout (or
only its abstract state), and count the bytes each device holds."""
import contextlib

import jax
from flax import nnx
from jax.sharding import PartitionSpec as P

import d2l_multi as d2l


def check_rules(rules, mesh):
    """Check that every rule maps a logical axis to None or to axes that ``mesh`` has."""
    for logical, target in rules.items():
        axes = target if isinstance(target, tuple) else (target,)
        missing = [a for a in axes if a is not None and a not in mesh.axis_names]
        if missing:
            raise ValueError(
                f"the rule {logical!r}: {target!r} names the mesh axis {missing[0]!r}, but the "
                f"mesh has only the axes {tuple(mesh.axis_names)}; map {logical!r} to one of "
                f"those, or to None to replicate it")


def check_layout(state, rules, mesh):
    """Check ``rules`` (``check_rules``), that every logical axis name on ``state``'s variables
    has a rule and that every dimension splits evenly over the mesh axes its rule names."""
    check_rules(rules, mesh)
    flat = jax.tree_util.tree_leaves_with_path(
        state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    for path, var in flat:
        names = var.get_metadata().get("out_sharding") or ()
        for name in names:
            if name is not None and name not in rules and name not in mesh.axis_names:
                raise ValueError(
                    f"parameter {jax.tree_util.keystr(path)} is annotated with the logical "
                    f"axis {name!r}, which the rules do not map; add {name!r}: None "
                    f"(replicate) or {name!r}: <a mesh axis> to the rules")
        spec = P(*[rules.get(name, name) if name is not None else None for name in names])
        try:
            d2l.check_spec(spec, mesh, var.shape)
        except ValueError as e:
            raise ValueError(f"parameter {jax.tree_util.keystr(path)}: {e}") from None


@contextlib.contextmanager
def use_sharding(mesh, rules):
    """Within this block, ``mesh`` is current and ``rules`` map logical names to its axes."""
    d2l.check_rules(rules, mesh)
    with jax.set_mesh(mesh), nnx.logical_axis_rules(tuple(rules.items())):
        yield


def abstract_state(model_fn, mesh, rules):
    """``model_fn()``'s state as ``ShapeDtypeStruct``s carrying their shardings: no arrays."""
    with nnx.use_eager_sharding(False):  # only the shapes and the annotations
        state = nnx.state(nnx.eval_shape(model_fn))
    d2l.check_layout(state, rules, mesh)  # names the parameter and the fix
    with use_sharding(mesh, rules):
        shardings = nnx.get_named_sharding(state, mesh)
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        state, shardings)


def create_sharded(model_fn, mesh, rules):
    """Build ``model_fn()`` inside ``nnx.jit``: each device only ever holds its own shards."""
    abstract_state(model_fn, mesh, rules)  # checks the rules and the layout first
    with use_sharding(mesh, rules):
        return nnx.jit(model_fn)()


def bytes_per_device(tree):
    """How many bytes of ``tree``'s arrays each device holds: {device: bytes}."""
    held = {}
    for x in jax.tree.leaves(tree):
        for s in x.addressable_shards:
            held[s.device] = held.get(s.device, 0) + s.data.nbytes
    return held
