"""Sharding beyond data parallelism: the rules that map a model's logical axis names to the axes
of a 2-D ``('data', 'model')`` mesh -- data parallelism, fully-sharded data parallelism (FSDP),
tensor parallelism (TP) and their mixes differ only in the rules -- sharded creation and
resharding of NNX models, and measuring a layout."""
import contextlib
import re

import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

import d2l_multi as d2l

LOGICAL_AXES = ("batch", "embed", "heads", "mlp", "vocab")  # names TransformerLM uses

STRATEGIES = {  # name: (mesh shape over ('data', 'model'), -1 = the remaining devices;
                #        logical axis -> mesh axis; the logical axes not named are replicated)
    "dp": ((-1, 1), {"batch": "data"}),
    "fsdp": ((-1, 1), {"batch": "data", "embed": "data"}),
    "tp": ((1, -1), {"heads": "model", "mlp": "model", "vocab": "model"}),
    "dp+tp": ((2, -1), {"batch": "data", "heads": "model", "mlp": "model", "vocab": "model"}),
    "fsdp+tp": ((2, -1), {"batch": "data", "embed": "data",
                          "heads": "model", "mlp": "model", "vocab": "model"}),
}


def sharding_rules(strategy):
    """The mesh shape and the complete rules (every logical axis, None = replicated) of one of
    ``STRATEGIES``: the one place where DP, FSDP, TP and their mixes differ."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; use one of {list(STRATEGIES)}")
    shape, rules = STRATEGIES[strategy]
    return shape, {axis: rules.get(axis) for axis in LOGICAL_AXES}


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
    """Check that every logical axis name on ``state``'s variables has a rule and that every
    dimension splits evenly over the mesh axes its rule names."""
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


def abstract_state(model_fn, mesh, rules):
    """The state of ``model_fn()`` as ``jax.ShapeDtypeStruct`` leaves that carry their
    ``NamedSharding`` on ``mesh`` under ``rules`` -- shapes and layouts, no arrays. It is what
    ``create_sharded`` will build, and the target an Orbax restore lays the values out on.
    ``model_fn``: a function of no arguments returning an NNX Module (or an nnx.Optimizer,
    or a tuple of them)."""
    check_rules(rules, mesh)
    with nnx.use_eager_sharding(False):  # only the shapes and the annotations
        state = nnx.state(nnx.eval_shape(model_fn))
    check_layout(state, rules, mesh)
    with use_sharding(mesh, rules):
        shardings = nnx.get_named_sharding(state, mesh)
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        state, shardings)


def create_sharded(model_fn, mesh, rules, optimizer=None):
    """Build ``model_fn()`` directly in its sharded layout: created inside ``nnx.jit``, each
    device only ever holds its own shards. With an optax ``optimizer``, return the model and
    an ``nnx.Optimizer`` whose state is laid out like the parameters."""
    abstract_state(model_fn, mesh, rules)  # fails early, naming the parameter and the fix

    @nnx.jit
    def create():
        model = model_fn()
        state = nnx.state(model)
        nnx.update(model, jax.lax.with_sharding_constraint(state, nnx.get_partition_spec(state)))
        if optimizer is None:
            return model
        return model, nnx.Optimizer(model, optimizer, wrt=nnx.Param)

    with use_sharding(mesh, rules):
        return create()


@contextlib.contextmanager
def use_sharding(mesh, rules):
    """Within this block, ``mesh`` is the current mesh and ``rules`` map logical axis names
    to its axes: jitted code traced here (``lm_train_step``) lays its arrays out by them."""
    check_rules(rules, mesh)
    with jax.set_mesh(mesh), nnx.logical_axis_rules(tuple(rules.items())):
        yield


def reshard(node, mesh, rules):
    """A copy of ``node`` (a Module or an nnx.Optimizer) laid out on ``mesh`` by ``rules``: its
    arrays move between devices as the new layout asks, and its values stay the same."""
    check_rules(rules, mesh)
    graphdef, state = nnx.split(node)
    with use_sharding(mesh, rules):
        check_layout(state, rules, mesh)
        shardings = nnx.get_named_sharding(state, mesh)
    return nnx.merge(graphdef, jax.device_put(state, shardings))


def shard_tokens(X, Y, mesh, rules):
    """Lay a batch of token ids out as the rules say for the logical axis 'batch'."""
    spec = P(rules.get("batch"))
    d2l.check_spec(spec, mesh, np.shape(X))
    return jax.device_put((X, Y), NamedSharding(mesh, spec))


# --- Measuring the layout: bytes per device and the collectives in the program ------------

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def bytes_per_device(tree):
    """How many bytes of ``tree``'s arrays each device holds: {device: bytes}."""
    held = {}
    for x in jax.tree.leaves(tree):
        for s in x.addressable_shards:
            held[s.device] = held.get(s.device, 0) + s.data.nbytes
    return held


def count_collectives(hlo_text):
    """How many of each collective a compiled program (``compiled.as_text()``) runs; the
    asynchronous ``-start``/``-done`` pairs of GPUs and TPUs count once."""
    counts = dict.fromkeys(COLLECTIVES, 0)
    for op in re.findall(r"\b(" + "|".join(COLLECTIVES) + r")(?:-start)?\(", hlo_text):
        counts[op] += 1
    return counts
