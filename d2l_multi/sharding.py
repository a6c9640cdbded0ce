"""Logical sharding of NNX models: rules map the logical axis names on a
model's parameters to the axes of a device mesh; check them, create the model
directly in its sharded layout (or only its abstract state), and count the
bytes each device holds."""
import contextlib
from collections.abc import Callable
from typing import Any

import jax
from flax import nnx
from jax.sharding import Mesh
from jax.sharding import PartitionSpec as P

from . import _checks as check
from .errors import InputError


def _check_rules(rules, mesh):
    """Check that each rule maps a logical name to None or to mesh axes."""
    for logical, target in rules.items():
        axes = target if isinstance(target, tuple) else (target,)
        missing = [a for a in axes
                   if a is not None and a not in mesh.axis_names]
        if missing:
            raise InputError(
                f"the rule {logical!r}: {target!r} names the mesh axis "
                f"{missing[0]!r}, but the mesh has only the axes "
                f"{tuple(mesh.axis_names)}; map {logical!r} to one of those, "
                f"or to None to replicate it")


def _check_layout(state, rules, mesh):
    """Check ``rules`` (``_check_rules``), that every logical axis name on
    ``state``'s variables has a rule and that every dimension splits evenly over
    the mesh axes its rule names."""
    _check_rules(rules, mesh)
    flat = jax.tree_util.tree_leaves_with_path(
        state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    for path, var in flat:
        names = var.get_metadata().get("out_sharding") or ()
        for name in names:
            if (name is not None and name not in rules
                    and name not in mesh.axis_names):
                raise InputError(
                    f"parameter {jax.tree_util.keystr(path)} is annotated with "
                    f"the logical axis {name!r}, which the rules do not map; "
                    f"add {name!r}: None (replicate) or "
                    f"{name!r}: <a mesh axis> to the rules")
        spec = P(*[rules.get(name, name) if name is not None else None
                   for name in names])
        try:
            check.spec(spec, mesh, var.shape)
        except ValueError as e:
            raise InputError(
                f"parameter {jax.tree_util.keystr(path)}: {e}") from None


@contextlib.contextmanager
def use_sharding(mesh, rules):
    """In this block ``mesh`` is current, ``rules`` map names to its axes."""
    with jax.set_mesh(mesh), nnx.logical_axis_rules(tuple(rules.items())):
        yield


def abstract_state(model_fn, mesh, rules):
    """``model_fn()``'s state as shapes with their shardings: no arrays."""
    with nnx.use_eager_sharding(False):  # only the shapes and the names
        state = nnx.state(nnx.eval_shape(model_fn))
    with use_sharding(mesh, rules):
        shardings = nnx.get_named_sharding(state, mesh)
    shape = lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s)
    return jax.tree.map(shape, state, shardings)


def create_sharded(model_fn, mesh, rules):
    """Build ``model_fn()`` in ``nnx.jit``: each device makes its shards."""
    with use_sharding(mesh, rules):
        return nnx.jit(model_fn)()


def bytes_per_device(tree):
    """How many bytes of ``tree``'s arrays each device holds, by device."""
    held = {}
    for x in jax.tree.leaves(tree):
        for s in x.addressable_shards:
            held[s.device] = held.get(s.device, 0) + s.data.nbytes
    return held


Rules = dict[str, Any]  # logical axis name -> a mesh axis, a tuple of them, or None


def _check_model_layout(model_fn: Callable[[], nnx.Module], mesh: Mesh, rules: Rules) -> None:
    """Check ``rules`` against ``mesh`` and the layout of ``model_fn()``'s state
    (``_check_layout``), from shapes alone: what ``abstract_state`` and
    ``create_sharded`` refuse before they build anything."""
    check.mesh(mesh)
    _check_rules(rules, mesh)
    with nnx.use_eager_sharding(False):
        state = nnx.state(nnx.eval_shape(model_fn))
    _check_layout(state, rules, mesh)  # names the parameter and the fix


def _check_mesh_rules(mesh: Mesh, rules: Rules) -> None:
    check.mesh(mesh)
    if not isinstance(rules, dict):
        raise InputError(f"rules must be a dict of logical axis -> mesh axis, e.g. "
                         f"{{'batch': 'data'}}, got {rules!r}")
    _check_rules(rules, mesh)


def _check_held(tree: Any) -> None:
    check.tree(tree, "tree")


use_sharding = check.validated(use_sharding, _check_mesh_rules)
abstract_state = check.validated(abstract_state, _check_model_layout)
create_sharded = check.validated(create_sharded, _check_model_layout)
bytes_per_device = check.validated(bytes_per_device, _check_held)
