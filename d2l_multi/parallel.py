"""Data parallelism by hand: allreduce, a ring allreduce, split_batch and a pmapped SGD step."""
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

import d2l_multi as d2l


def allreduce(data):
    """Sum arrays that live on different devices and give every device the sum (by hand)."""
    total = data[0]
    for x in data[1:]:
        total = total + jax.device_put(x, total.device)  # gather onto the first device
    return [jax.device_put(total, x.device) for x in data]  # broadcast the sum back


def ring_allreduce(x, axis_name):
    """Sum ``x`` over ``axis_name`` with a ring: reduce-scatter, then all-gather.

    Call it inside ``pmap`` or ``shard_map``. Each of the k devices sends 2(k-1) chunks of
    size n/k to its right-hand neighbour, so it moves 2(k-1)/k * n values in all.
    """
    k = lax.axis_size(axis_name)
    if k == 1:
        return x
    i = lax.axis_index(axis_name)
    right = [(j, (j + 1) % k) for j in range(k)]
    flat = x.reshape(-1)
    pad = -flat.size % k
    chunks = jnp.pad(flat, (0, pad)).reshape(k, -1)
    for s in range(k - 1):  # reduce-scatter: after it, device i owns the sum of chunk i+1
        received = lax.ppermute(chunks[(i - s) % k], axis_name, right)
        chunks = chunks.at[(i - s - 1) % k].add(received)
    for s in range(k - 1):  # all-gather: pass the finished chunks once around the ring
        received = lax.ppermute(chunks[(i + 1 - s) % k], axis_name, right)
        chunks = chunks.at[(i - s) % k].set(received)
    return chunks.reshape(-1)[:flat.size].reshape(x.shape)


def check_divisible(batch_size, num_devices):
    """Raise a ValueError naming the nearest batch sizes when ``batch_size % num_devices``."""
    if batch_size % num_devices:
        lower = batch_size - batch_size % num_devices
        upper = lower + num_devices
        options = " or ".join(str(b) for b in (lower, upper) if b > 0)
        raise ValueError(f"batch size {batch_size} does not divide evenly over "
                         f"{num_devices} devices; use a multiple of {num_devices}, "
                         f"e.g. {options}")


def split_batch(X, y, num_devices):
    """Split ``X`` and ``y`` into ``num_devices`` equal shards along a new leading axis."""
    check_divisible(X.shape[0], num_devices)
    return (X.reshape(num_devices, -1, *X.shape[1:]),
            y.reshape(num_devices, -1, *y.shape[1:]))


def replicate(params, devices):
    """Put a copy of ``params`` on every device, stacked along a leading device axis."""
    sharding = NamedSharding(Mesh(devices, ("devices",)), P("devices"))
    stack = lambda a: jnp.broadcast_to(a, (len(devices), *jnp.shape(a)))
    return jax.device_put(jax.tree.map(stack, params), sharding)


def unreplicate(params):
    """Take the copy held by the first device (all copies are equal)."""
    return jax.tree.map(lambda a: a[0], params)


@functools.partial(jax.pmap, axis_name="devices", in_axes=(0, 0, 0, None),
                   static_broadcasted_argnums=4)
def pmap_sgd_step(params, X, y, lr, conv=d2l.conv2d):
    """One SGD step on every device: local gradients, averaged with ``pmean``, same update."""
    loss, grads = jax.value_and_grad(d2l.loss_fn)(params, X, y, conv)
    grads = lax.pmean(grads, axis_name="devices")   # the allreduce of data parallelism
    loss = lax.pmean(loss, axis_name="devices")
    return [p - lr * g for p, g in zip(params, grads)], loss


def train_batch(params, X, y, num_devices, lr, conv=d2l.conv2d):
    """Split a global batch over the devices and take one data-parallel SGD step."""
    X_shards, y_shards = split_batch(X, y, num_devices)
    return pmap_sgd_step(params, X_shards, y_shards, lr, conv)
