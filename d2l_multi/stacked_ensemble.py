"""Stacked ensembles (appendix A2): the members of an ensemble as one pytree with a
leading 'model' axis, made and trained with ``jax.vmap`` under ``jit``, laid out over a
mesh's 'model' axis, and placed member by member with ``shard_map``.

The shown functions carry no argument checks; their public names check first
(``check.validated``), so bad input gets a message naming the fix."""
import functools
from collections.abc import Callable

import jax
from flax.training.train_state import TrainState
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jax.typing import ArrayLike

from . import _checks as check
from ._earlier import stacked_ensemble as d2l
from .ensemble import _check_ensemble_size
from .flax_models import _check_linen_batch


def create_stacked_ensemble(rngs, learning_rate, momentum, mesh):
    """``create_train_state`` vmapped over the keys, its 'model' axis sharded
    over ``mesh``."""
    create = jax.vmap(d2l.create_train_state, in_axes=(0, None, None))
    create = jax.jit(create, static_argnums=(1, 2),
                     out_shardings=NamedSharding(mesh, P("model")))
    return create(rngs, learning_rate, momentum)


@jax.jit
def stacked_train_step(state, images, labels):
    """``member_step`` vmapped over a stacked ``state``; the compiler places
    the members."""
    step = functools.partial(d2l.member_step, images=images, labels=labels,
                             axis_name="member")
    return jax.vmap(step, axis_name="member")(state)


@functools.lru_cache
def map_members(member_fn, mesh):
    """``jit(shard_map(vmap(member_fn)))``: each device maps ``member_fn``
    over its own members."""
    def local(state, images, labels):  # state: this device's members
        fn = functools.partial(member_fn, images=images, labels=labels,
                               axis_name=("model", "member"))
        return jax.vmap(fn, axis_name="member")(state)
    return jax.jit(jax.shard_map(local, mesh=mesh,
                                 in_specs=(P("model"), P(), P()),
                                 out_specs=P("model"), check_vma=False))


def _check_stacked(rngs: jax.Array, learning_rate: float, momentum: float, mesh: Mesh) -> None:
    check.mesh(mesh)
    check.spec(P("model"), mesh)
    _check_ensemble_size(len(rngs), mesh.shape["model"])
    check.positive(learning_rate=learning_rate)
    check.nonnegative(momentum=momentum)


def _check_model_axis(member_fn: Callable[..., object], mesh: Mesh) -> None:
    check.mesh(mesh)
    check.spec(P("model"), mesh)


def _check_stacked_step(state: TrainState, images: ArrayLike, labels: ArrayLike) -> None:
    _check_linen_batch(state, images, labels)  # one batch for every member


stacked_train_step = check.validated(stacked_train_step, _check_stacked_step)
create_stacked_ensemble = check.validated(create_stacked_ensemble, _check_stacked)
map_members = check.validated(map_members, _check_model_axis)
