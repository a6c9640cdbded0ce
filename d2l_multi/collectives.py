"""Collectives by hand: an allreduce over device copies, replicating parameters, and a ring
allreduce (reduce-scatter, then all-gather) written with ``lax.ppermute``."""
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from . import _checks as check
from .errors import InputError


def allreduce(data):
    """Sum arrays on different devices; give every device the sum (by hand)."""
    total = data[0]
    for x in data[1:]:
        total = total + jax.device_put(x, total.device)  # gather onto device 0
    return [jax.device_put(total, x.device) for x in data]  # broadcast back


def _check_allreduce(data: Sequence[jax.Array]) -> None:
    if not isinstance(data, (list, tuple)) or not len(data):
        got = repr(data) if isinstance(data, (list, tuple)) else type(data).__name__
        raise InputError(f"allreduce needs a list with one array per device, got {got}")
    if not all(isinstance(x, jax.Array) for x in data) or len({x.shape for x in data}) > 1:
        raise InputError(f"allreduce needs JAX arrays of one shape, one per device, got "
                         f"{[getattr(x, 'shape', type(x).__name__) for x in data]}")


def replicate(params, devices):
    """Put a copy of ``params`` on every device, stacked along a new axis 0."""
    sharding = NamedSharding(Mesh(devices, ("devices",)), P("devices"))
    stack = lambda a: jnp.broadcast_to(a, (len(devices), *jnp.shape(a)))
    return jax.device_put(jax.tree.map(stack, params), sharding)


def _check_replicate(params: Any, devices: Sequence[jax.Device]) -> None:
    check.tree(params)
    if devices is not None and not len(devices):
        raise InputError("replicate needs at least one device, got none; pass d2l.devices(n)")
    check.devices(devices)


def _check_unreplicate(params: Any) -> None:
    check.tree(params)
    for x in jax.tree.leaves(params):
        if not isinstance(x, jax.Array) or not jnp.ndim(x) or \
                x.addressable_shards[0].data.shape[0] != 1:  # one copy per device
            raise InputError(f"params must hold device copies stacked along axis 0 (as "
                             f"d2l.replicate makes them), found {type(x).__name__} of shape "
                             f"{jnp.shape(x)}" + (f" on {len(x.sharding.device_set)} device(s)"
                                                  if isinstance(x, jax.Array) else ""))


def _check_ring(x: jax.Array, axis_name: str) -> None:
    if not isinstance(axis_name, str):
        raise InputError(f"axis_name must name a mesh axis (a str), got {axis_name!r}")


def unreplicate(params):
    """Take the copy held by the first device (all copies are equal)."""
    return jax.tree.map(lambda a: a.addressable_shards[0].data[0], params)


def ring_allreduce(x, axis_name):
    """Sum ``x`` over ``axis_name`` with a ring of ``lax.ppermute``s."""
    k = lax.axis_size(axis_name)
    i = lax.axis_index(axis_name)
    right = [(j, (j + 1) % k) for j in range(k)]
    chunks = jnp.pad(x.reshape(-1), (0, -x.size % k)).reshape(k, -1)  # padded
    for s in range(k - 1):  # reduce-scatter: device i ends with chunk i + 1
        received = lax.ppermute(chunks[(i - s) % k], axis_name, right)
        chunks = chunks.at[(i - s - 1) % k].add(received)
    for s in range(k - 1):  # all-gather: the finished chunks go round once
        received = lax.ppermute(chunks[(i + 1 - s) % k], axis_name, right)
        chunks = chunks.at[(i - s) % k].set(received)
    return chunks.reshape(-1)[:x.size].reshape(x.shape)


allreduce = check.validated(allreduce, _check_allreduce)
replicate = check.validated(replicate, _check_replicate)
unreplicate = check.validated(unreplicate, _check_unreplicate)
ring_allreduce = check.validated(ring_allreduce, _check_ring)
