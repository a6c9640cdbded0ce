"""Ensembles, one model per device (notebook 08): Flax's ensembling recipe
with ``pmap`` (every device initialises and trains a different CNN on the same
batches; the members' softmax probabilities are averaged with ``lax.pmean``)
and one member's step, whose ``jit(shard_map)`` twin replaces ``pmap``.
Stacked ensembles (appendix A2): the same members as one pytree with a leading
'model' axis, made and trained with ``jax.vmap`` under ``jit``, laid out over a
mesh's 'model' axis, and placed member by member with ``shard_map``.

The shown functions carry no argument checks; their public names check first
(``d2l.validated``), so bad input gets a message naming the fix."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import jax_utils
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import d2l_multi as d2l
from .utils import validated


def check_ensemble_size(num_members, num_devices, one_per_device=False):
    """Raise a ValueError naming the fix unless ``num_members`` models fit
    ``num_devices``."""
    if (isinstance(num_members, bool) or not isinstance(num_members, int)
            or num_members < 1):
        raise ValueError(f"an ensemble needs a positive number of models, got "
                         f"{num_members!r}")
    if one_per_device and num_members != num_devices:
        raise ValueError(
            f"the pmap ensemble puts one model on each device, so it needs as "
            f"many models as devices: got {num_members} keys for {num_devices} "
            f"devices. Pass jax.random.split(rng, {num_devices}), or train "
            f"{num_members} models as a stacked ensemble "
            f"(d2l.create_stacked_ensemble) on a mesh whose 'model' axis "
            f"divides {num_members}")
    try:
        d2l.check_divisible(num_members, num_devices, "an ensemble of",
                            "devices of the mesh's 'model' axis")
    except ValueError as e:
        axis = max(d for d in range(1, num_devices + 1)
                   if num_members % d == 0 and num_devices % d == 0)
        raise ValueError(
            f"{e} models, or a 'model' axis of {axis} "
            f"device{'s' if axis > 1 else ''} (a divisor of {num_members}), "
            f"e.g. a ({axis}, {num_devices // axis}) mesh with axes "
            f"('model', 'data') that also splits each batch over 'data'"
        ) from None


# ----- notebook 08: one model per device, with pmap -----

def create_ensemble_state(rngs, learning_rate, momentum):
    """Flax's recipe: ``create_train_state`` pmapped, one key per device."""
    create = jax.pmap(d2l.create_train_state,
                      static_broadcasted_argnums=(1, 2))
    return create(rngs, learning_rate, momentum)


def member_step(state, images, labels, axis_name):
    """One member's SGD step and loss; the ensemble's accuracy, its
    probabilities averaged over ``axis_name``."""
    grad_fn = jax.value_and_grad(d2l.cross_entropy_loss, has_aux=True)
    (loss, logits), grads = grad_fn(state.params, state, images, labels)
    probs = lax.pmean(jax.nn.softmax(logits), axis_name=axis_name)
    accuracy = jnp.mean(jnp.argmax(probs, -1) == labels)
    return state.apply_gradients(grads=grads), loss, accuracy


ensemble_step = jax.pmap(functools.partial(member_step, axis_name="ensemble"),
                         axis_name="ensemble")


def train_ensemble(state, data, num_epochs):
    """Flax's ensemble loop: every member steps on every batch."""
    train_iter = data.get_dataloader(True, drop_last=True)
    for epoch in range(num_epochs):
        for X, y in train_iter:
            state, loss, accuracy = ensemble_step(
                state, *jax_utils.replicate((X, y)))
        print(f"epoch {epoch + 1}: member losses {np.asarray(loss).round(2)}, "
              f"ensemble accuracy {accuracy[0]:.2f} (last batch)")
    return state


# ----- appendix A2: stacked ensembles, vmap under jit -----

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


# ----- the checks behind the public names -----

def _check_pmap_keys(rngs, learning_rate, momentum):
    check_ensemble_size(len(rngs), jax.local_device_count(),
                        one_per_device=True)


def _check_epochs(state, data, num_epochs):
    d2l.check_positive(num_epochs=num_epochs)


def _check_stacked(rngs, learning_rate, momentum, mesh):
    d2l.check_spec(P("model"), mesh)
    check_ensemble_size(len(rngs), mesh.shape["model"])


def _check_model_axis(member_fn, mesh):
    d2l.check_spec(P("model"), mesh)


create_ensemble_state = validated(create_ensemble_state, _check_pmap_keys)
train_ensemble = validated(train_ensemble, _check_epochs)
create_stacked_ensemble = validated(create_stacked_ensemble, _check_stacked)
map_members = validated(map_members, _check_model_axis)
