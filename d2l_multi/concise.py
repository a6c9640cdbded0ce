"""Concise data parallelism: a device mesh, NamedShardings, one ``jax.jit`` training step that
the compiler parallelises, and its explicit-collectives twin written with ``jax.shard_map``."""
import math

import jax
import jax.numpy as jnp
import optax
from jax import lax
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import d2l_multi as d2l


def data_mesh(num_devices=None, axis_name="data"):
    """A one-axis mesh over the first ``num_devices`` devices (all when None), axis type Auto."""
    devices = d2l.devices(num_devices)  # too many asked: says how many exist, how to get more
    return jax.make_mesh((len(devices),), (axis_name,), axis_types=(AxisType.Auto,),
                         devices=devices)


def check_spec(spec, mesh, shape=None):
    """Check that ``spec`` names only axes of ``mesh`` and, given ``shape``, tiles it evenly."""
    for dim, entry in enumerate(spec):
        names = [n for n in (entry if isinstance(entry, tuple) else (entry,)) if n is not None]
        for name in names:
            if name not in mesh.axis_names:
                raise ValueError(
                    f"{spec} names the mesh axis {name!r}, but the mesh has only the axes "
                    f"{tuple(mesh.axis_names)}; write one of those in the PartitionSpec, or "
                    f"build the mesh with that name, e.g. d2l.data_mesh(axis_name={name!r})")
        parts = math.prod(mesh.shape[n] for n in names)
        if shape is not None and dim < len(shape) and shape[dim] % parts:
            lower = shape[dim] - shape[dim] % parts
            options = " or ".join(str(s) for s in (lower, lower + parts) if s > 0)
            raise ValueError(
                f"dimension {dim} of an array of shape {tuple(shape)} has size {shape[dim]}, "
                f"which does not split evenly over mesh axes {tuple(names)} ({parts} devices) "
                f"as {spec} asks; make it a multiple of {parts}, e.g. {options}")


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


def make_train_step(optimizer, loss=d2l.loss_fn):
    """A ``jax.jit``-compiled step; the shardings of its inputs decide how it is parallelised."""
    @jax.jit
    def train_step(params, opt_state, X, y):
        loss_value, grads = jax.value_and_grad(loss)(params, X, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss_value
    return train_step


def make_shard_map_step(mesh, optimizer, loss=d2l.loss_fn, axis_name="data"):
    """The same step written per device with ``jax.shard_map`` and explicit collectives."""
    def local_step(params, opt_state, X, y):  # X, y: this device's slice of the batch
        # Differentiate the *global* mean loss. With check_vma (the default), jax.grad with
        # respect to the replicated params already sums the per-device gradients: no pmean.
        global_loss = lambda p: lax.pmean(loss(p, X, y), axis_name)
        loss_value, grads = jax.value_and_grad(global_loss)(params)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss_value
    specs = (P(), P(), P(axis_name), P(axis_name))
    return jax.jit(jax.shard_map(local_step, mesh=mesh, in_specs=specs, out_specs=P()))


def throttle(x, i, every=8):
    """Wait for ``x`` at every ``every``-th step ``i``: at most ``every`` steps are queued.

    JAX dispatches steps asynchronously, so a training loop can queue hundreds of them. With
    multi-device steps on XLA:CPU (simulated devices) that deadlocks: the collectives abort
    with "Termination timeout for all reduce". Waiting now and then keeps the queue short.
    """
    if i % every == every - 1:
        jax.block_until_ready(x)
    return x
