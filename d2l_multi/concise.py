"""Concise data parallelism: one ``jax.jit`` training step that the compiler parallelises
(automatic mode), its per-device twin written with ``jax.shard_map`` and explicit collectives
(manual mode), and a count of the collectives in a compiled program (read by
``d2l.collective_ops``, in the synchronous and asynchronous forms XLA prints).

``shard``, ``shard_batch`` and ``check_spec`` place arrays on a mesh after checking that the
spec fits it; the chapter calls ``jax.device_put(x, NamedSharding(mesh, spec))`` directly, and
the library uses these where a clear error for a bad spec helps."""
import math

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import d2l_multi as d2l

from .hlo import COLLECTIVES
from .utils import validated


def check_spec(spec, mesh, shape=None):
    """Check that ``spec`` names only axes of ``mesh`` and, given ``shape``, tiles it evenly."""
    for dim, entry in enumerate(spec):
        names = [n for n in (entry if isinstance(entry, tuple) else (entry,)) if n is not None]
        for name in names:
            if name not in mesh.axis_names:
                raise ValueError(f"{spec} names the mesh axis {name!r}, but the mesh has only "
                                 f"the axes {tuple(mesh.axis_names)}; use one of those, or build "
                                 f"the mesh with it: d2l.device_mesh(axis_names=({name!r},))")
        parts = math.prod(mesh.shape[n] for n in names)
        if shape is not None and dim < len(shape):
            d2l.check_divisible(shape[dim], parts, f"dimension {dim} of shape {tuple(shape)}: size",
                                f"devices of the mesh axes {tuple(names)} ({spec})")


def shard(tree, mesh, spec=P()):
    """Put every array of ``tree`` on ``mesh``, laid out as ``spec`` (``P()``: replicated)."""
    for x in jax.tree.leaves(tree):
        check_spec(spec, mesh, jnp.shape(x))
    return jax.device_put(tree, NamedSharding(mesh, spec))


def shard_batch(X, y, mesh, axis_name="data"):
    """Split a global batch along the mesh axis ``axis_name``: one slice of rows per device."""
    check_spec(P(axis_name), mesh)
    d2l.check_divisible(X.shape[0], mesh.shape[axis_name])
    return shard((X, y), mesh, P(axis_name))


def _check_batch_labels(X, y, *args, **kwargs):
    d2l.check_labels(X, y)


shard_batch = d2l.validated(shard_batch, _check_batch_labels)


def check_step_optimizer(optimizer):
    """Raise a TypeError unless a step's ``optimizer`` is an optax optimizer (has ``update``)."""
    if not hasattr(optimizer, "update"):
        raise TypeError(f"optimizer must be an optax optimizer such as optax.sgd(0.1), "
                        f"got {optimizer!r}")


def make_train_step(optimizer, loss=None):
    """A jitted step of ``loss`` (``d2l.loss_fn``); input shardings split it."""
    loss = loss or d2l.loss_fn

    @jax.jit
    def train_step(params, opt_state, X, y):
        loss_value, grads = jax.value_and_grad(loss)(params, X, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss_value
    return train_step


def check_train_step(optimizer, loss=None):
    """Raise a TypeError unless ``optimizer`` is an optax optimizer."""
    check_step_optimizer(optimizer)


def make_shard_map_step(mesh, optimizer, loss=None, axis_name="data"):
    """A per-device step (``jax.shard_map``): the mean loss's gradient."""
    loss = loss or d2l.loss_fn

    def local_step(params, opt_state, X, y):  # X, y: this device's slice
        global_loss = lambda p: lax.pmean(loss(p, X, y), axis_name)
        loss_value, grads = jax.value_and_grad(global_loss)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss_value
    specs = (P(), P(), P(axis_name), P(axis_name))
    return jax.jit(jax.shard_map(local_step, mesh=mesh, in_specs=specs,
                                 out_specs=P()))


def check_shard_map_step(mesh, optimizer, loss=None, axis_name="data"):
    """Raise unless ``optimizer`` is optax's and ``mesh`` has ``axis_name``."""
    check_step_optimizer(optimizer)
    check_spec(P(axis_name), mesh)


def count_collectives(hlo_text):
    """Count each collective in HLO text once, whether XLA runs it as one
    instruction or as a start and a done (``d2l.collective_ops``)."""
    counts = dict.fromkeys(COLLECTIVES, 0)
    for op in d2l.collective_ops(hlo_text):
        counts[op.kind] += 1
    return counts


def check_hlo_text(hlo_text):
    """Raise a TypeError unless ``hlo_text`` is HLO text (a string), not a compiled program."""
    if not isinstance(hlo_text, str):
        raise TypeError(f"count_collectives reads HLO text, not a {type(hlo_text).__name__}; "
                        f"pass f.lower(*args).compile().as_text()")


make_train_step = validated(make_train_step, check_train_step)
make_shard_map_step = validated(make_shard_map_step, check_shard_map_step)
count_collectives = validated(count_collectives, check_hlo_text)
