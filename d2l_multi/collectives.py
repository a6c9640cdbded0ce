"""Collectives by hand: an allreduce over device copies, replicating parameters, and a ring
allreduce (reduce-scatter, then all-gather) written with ``lax.ppermute``."""
import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P


def allreduce(data):
    """Sum arrays that live on different devices and give every device the sum (by hand)."""
    if not data:
        raise ValueError("allreduce needs a list with one array per device, got []")
    total = data[0]
    for x in data[1:]:
        total = total + jax.device_put(x, total.device)  # gather onto the first device
    return [jax.device_put(total, x.device) for x in data]  # broadcast the sum back


def replicate(params, devices):
    """Put a copy of ``params`` on every device, stacked along a leading device axis."""
    if not devices:
        raise ValueError("replicate needs at least one device, got none; pass d2l.devices(n)")
    sharding = NamedSharding(Mesh(devices, ("devices",)), P("devices"))
    stack = lambda a: jnp.broadcast_to(a, (len(devices), *jnp.shape(a)))
    return jax.device_put(jax.tree.map(stack, params), sharding)


def unreplicate(params):
    """Take the copy held by the first device (all copies are equal)."""
    return jax.tree.map(lambda a: a[0], params)


def ring_allreduce(x, axis_name):
    """Sum ``x`` over ``axis_name`` (in ``pmap`` or ``shard_map``) with a ring of ppermutes."""
    k = lax.axis_size(axis_name)
    i = lax.axis_index(axis_name)
    right = [(j, (j + 1) % k) for j in range(k)]
    chunks = jnp.pad(x.reshape(-1), (0, -x.size % k)).reshape(k, -1)  # k chunks, zero-padded
    for s in range(k - 1):  # reduce-scatter: after it, device i owns the sum of chunk i+1
        received = lax.ppermute(chunks[(i - s) % k], axis_name, right)
        chunks = chunks.at[(i - s - 1) % k].add(received)
    for s in range(k - 1):  # all-gather: pass the finished chunks once around the ring
        received = lax.ppermute(chunks[(i + 1 - s) % k], axis_name, right)
        chunks = chunks.at[(i - s) % k].set(received)
    return chunks.reshape(-1)[:x.size].reshape(x.shape)
