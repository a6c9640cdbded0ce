"""Concise data parallelism: a device mesh, NamedShardings, one ``jax.jit`` training step that
the compiler parallelises, and its explicit-collectives twin written with ``jax.shard_map``."""
import math

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import d2l_multi as d2l


def check_spec(spec, mesh, shape=None):
    """Check that ``spec`` names only axes of ``mesh`` and, given ``shape``, tiles it evenly."""
    for dim, entry in enumerate(spec):
        names = [n for n in (entry if isinstance(entry, tuple) else (entry,)) if n is not None]
        for name in names:
            if name not in mesh.axis_names:
                raise ValueError(
                    f"{spec} names the mesh axis {name!r}, but the mesh has only the axes "
                    f"{tuple(mesh.axis_names)}; write one of those in the PartitionSpec, or "
                    f"build the mesh with that name, e.g. d2l.device_mesh(axis_names=({name!r},))")
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


def make_train_step(optimizer, loss=None):
    """A ``jax.jit``-compiled step; the shardings of its inputs decide how it is parallelised.
    ``loss(params, X, y)`` defaults to LeNet's ``d2l.loss_fn``."""
    loss = loss or d2l.loss_fn

    @jax.jit
    def train_step(params, opt_state, X, y):
        loss_value, grads = jax.value_and_grad(loss)(params, X, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss_value
    return train_step


def make_shard_map_step(mesh, optimizer, loss=None, axis_name="data"):
    """The same step written per device with ``jax.shard_map`` and explicit collectives."""
    loss = loss or d2l.loss_fn

    def local_step(params, opt_state, X, y):  # X, y: this device's slice of the batch
        # Differentiate the *global* mean loss. With check_vma (the default), jax.grad with
        # respect to the replicated params already sums the per-device gradients: no pmean.
        global_loss = lambda p: lax.pmean(loss(p, X, y), axis_name)
        loss_value, grads = jax.value_and_grad(global_loss)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss_value
    specs = (P(), P(), P(axis_name), P(axis_name))
    return jax.jit(jax.shard_map(local_step, mesh=mesh, in_specs=specs, out_specs=P()))
