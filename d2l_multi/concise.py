"""Concise data parallelism: one ``jax.jit`` training step that the compiler parallelises
(automatic mode), its per-device twin written with ``jax.shard_map`` and explicit collectives
(manual mode), and a count of the collectives in a compiled program (read by
``d2l.collective_ops``, in the synchronous and asynchronous forms XLA prints).

``shard``, ``shard_batch`` and ``check_spec`` place arrays on a mesh after checking that the
spec fits it; the chapter calls ``jax.device_put(x, NamedSharding(mesh, spec))`` directly, and
the library uses these where a clear error for a bad spec helps."""
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jax.typing import ArrayLike

from . import _checks as check
from ._earlier import concise as d2l
from .hlo import COLLECTIVES, _check_hlo_text


def shard(tree: Any, mesh: Mesh, spec: P = P()) -> Any:
    """Put every array of ``tree`` on ``mesh``, laid out as ``spec`` (``P()``: replicated)."""
    for x in jax.tree.leaves(tree):
        check.spec(spec, mesh, jnp.shape(x))
    return jax.device_put(tree, NamedSharding(mesh, spec))


def shard_batch(X: ArrayLike, y: ArrayLike, mesh: Mesh,
                axis_name: str = "data") -> tuple[jax.Array, jax.Array]:
    """Split a global batch along the mesh axis ``axis_name``: one slice of rows per device."""
    check.spec(P(axis_name), mesh)
    check.divisible(X.shape[0], mesh.shape[axis_name])
    return shard((X, y), mesh, P(axis_name))


def _check_batch_labels(X: ArrayLike, y: ArrayLike, mesh: Mesh,
                        axis_name: str = "data") -> None:
    check.examples(X, y)
    if not check._is_tracer(y) and np.ndim(y) == 1 and np.asarray(y).dtype.kind in "iu":
        check.labels(y)  # class indices: none negative


shard_batch = check.validated(shard_batch, _check_batch_labels)


def make_train_step(optimizer, loss=None):
    """A jitted step of ``loss`` (``d2l.loss_fn``); input shardings split it."""
    loss = loss or d2l.loss_fn

    @jax.jit
    def train_step(params, opt_state, X, y):
        loss_value, grads = jax.value_and_grad(loss)(params, X, y)
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss_value
    return train_step


Loss = Callable[[Any, Any, Any], jax.Array]  # loss(params, X, y) -> a scalar


def _check_train_step(optimizer: optax.GradientTransformation, loss: Loss | None = None) -> None:
    check.optimizer(optimizer)


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


def _check_shard_map_step(mesh: Mesh, optimizer: optax.GradientTransformation,
                          loss: Loss | None = None, axis_name: str = "data") -> None:
    check.optimizer(optimizer)
    check.spec(P(axis_name), mesh)


def count_collectives(hlo_text):
    """Count each collective in HLO text once, whether XLA runs it as one
    instruction or as a start and a done (``d2l.collective_ops``)."""
    counts = dict.fromkeys(COLLECTIVES, 0)
    for op in d2l.collective_ops(hlo_text):
        counts[op.kind] += 1
    return counts


make_train_step = check.validated(make_train_step, _check_train_step)
make_shard_map_step = check.validated(make_shard_map_step, _check_shard_map_step)
count_collectives = check.validated(count_collectives, _check_hlo_text)
