"""Ensembles, one model per device (notebook 08a): Flax's ensembling recipe with ``pmap`` (every
device initialises and trains a different CNN on the same batches; the members' softmax
probabilities are averaged with ``lax.pmean``). Stacked ensembles (notebook 08b): the same
members as one pytree with a leading 'model' axis, made and trained with ``jax.vmap`` under
``jit``, laid out over a mesh's 'model' axis, and placed member by member with ``shard_map``."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import jax_utils
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import d2l_multi as d2l


# ----- notebook 08a: one model per device, with pmap -----

def check_ensemble_size(num_members, num_devices, one_per_device=False):
    """Raise a ValueError naming the fix unless ``num_members`` models fit ``num_devices``."""
    if isinstance(num_members, bool) or not isinstance(num_members, int) or num_members < 1:
        raise ValueError(f"an ensemble needs a positive number of models, got {num_members!r}")
    if one_per_device and num_members != num_devices:
        raise ValueError(
            f"the pmap ensemble puts one model on each device, so it needs as many models as "
            f"devices: got {num_members} keys for {num_devices} devices. Pass "
            f"jax.random.split(rng, {num_devices}), or train {num_members} models as a stacked "
            f"ensemble (d2l.create_stacked_ensemble) on a mesh whose 'model' axis divides "
            f"{num_members}")
    try:
        d2l.check_divisible(num_members, num_devices, "an ensemble of",
                            "devices of the mesh's 'model' axis")
    except ValueError as e:
        axis = max(d for d in range(1, num_devices + 1)
                   if num_members % d == 0 and num_devices % d == 0)
        raise ValueError(
            f"{e} models, or a 'model' axis of {axis} device{'s' if axis > 1 else ''} (a "
            f"divisor of {num_members}), e.g. a ({axis}, {num_devices // axis}) mesh with axes "
            f"('model', 'data') that also splits each batch over 'data'") from None


def create_ensemble_state(rngs, learning_rate, momentum):
    """Flax's recipe: ``create_train_state`` pmapped, one key (a different CNN) per device."""
    d2l.check_ensemble_size(len(rngs), jax.local_device_count(), one_per_device=True)
    create = jax.pmap(d2l.create_train_state, static_broadcasted_argnums=(1, 2))
    return create(rngs, learning_rate, momentum)


@functools.partial(jax.pmap, axis_name="ensemble")
def apply_ensemble(state, images, labels):
    """Each member's gradients and loss on the batch; the ensemble's accuracy."""
    grad_fn = jax.value_and_grad(d2l.cross_entropy_loss, has_aux=True)
    (loss, logits), grads = grad_fn(state.params, state, images, labels)
    probs = lax.pmean(jax.nn.softmax(logits), axis_name="ensemble")  # average over members
    accuracy = jnp.mean(jnp.argmax(probs, -1) == labels)
    return grads, loss, accuracy


def member_num_correct(state, images, labels, axis_name):
    """Right predictions of one member and of the ensemble (averaged over ``axis_name``)."""
    probs = jax.nn.softmax(state.apply_fn({"params": state.params}, images))
    ensemble_probs = lax.pmean(probs, axis_name=axis_name)
    return ((jnp.argmax(probs, -1) == labels).sum(),
            (jnp.argmax(ensemble_probs, -1) == labels).sum())


@functools.partial(jax.pmap, axis_name="ensemble")
def ensemble_num_correct(state, images, labels):
    """``member_num_correct`` on every device of a pmap ensemble."""
    return member_num_correct(state, images, labels, axis_name="ensemble")


def evaluate_ensemble(state, data_iter):
    """Test accuracy of every member of a pmap ensemble (an array) and of the ensemble."""
    members, ensemble, n = 0, 0, 0
    for X, y in data_iter:
        correct = ensemble_num_correct(state, *jax_utils.replicate((X, y)))
        members_correct, ensemble_correct = jax.device_get(correct)
        members += members_correct
        ensemble += jax_utils.unreplicate(ensemble_correct)  # equal on every device
        n += len(y)
    return members / n, float(ensemble / n)


def train_ensemble(state, data, num_epochs):
    """Flax's ensemble loop, every batch replicated; metrics and test accuracies per epoch."""
    d2l.check_positive(num_epochs=num_epochs)
    animator = d2l.Animator(xlabel="epoch", ylabel="test accuracy", xlim=[1, num_epochs],
                            legend=["mean member", "ensemble"])
    train_iter = data.get_dataloader(True, drop_last=True)
    for epoch in range(num_epochs):
        for X, y in train_iter:
            grads, loss, accuracy = apply_ensemble(state, *jax_utils.replicate((X, y)))
            state = d2l.update_model(state, grads)
        members, ensemble = evaluate_ensemble(state, data.get_dataloader(False))
        animator.add(epoch + 1, (members.mean(), ensemble))
        print(f"epoch {epoch + 1}: last batch: loss per member {np.asarray(loss).round(2)}, "
              f"ensemble acc {jax_utils.unreplicate(accuracy):.3f}; test acc: mean member "
              f"{members.mean():.3f}, ensemble {ensemble:.3f}")
    return state, members, ensemble


# ----- notebook 08b: stacked ensembles, vmap under jit -----

def create_stacked_ensemble(rngs, learning_rate, momentum, mesh):
    """``create_train_state`` vmapped over the keys, its 'model' axis sharded over ``mesh``."""
    d2l.check_spec(P("model"), mesh)
    d2l.check_ensemble_size(len(rngs), mesh.shape["model"])
    create = jax.vmap(d2l.create_train_state, in_axes=(0, None, None))
    create = jax.jit(create, static_argnums=(1, 2),
                     out_shardings=NamedSharding(mesh, P("model")))
    return create(rngs, learning_rate, momentum)


def member_step(state, images, labels, axis_name):
    """One member's SGD step and loss; the accuracy of the ensemble over ``axis_name``."""
    grad_fn = jax.value_and_grad(d2l.cross_entropy_loss, has_aux=True)
    (loss, logits), grads = grad_fn(state.params, state, images, labels)
    probs = lax.pmean(jax.nn.softmax(logits), axis_name=axis_name)
    accuracy = jnp.mean(jnp.argmax(probs, -1) == labels)
    return state.apply_gradients(grads=grads), loss, accuracy


@jax.jit
def stacked_train_step(state, images, labels):
    """``member_step`` vmapped over a stacked ``state``; the compiler places the members."""
    step = functools.partial(member_step, images=images, labels=labels, axis_name="member")
    return jax.vmap(step, axis_name="member")(state)


@functools.lru_cache
def map_members(member_fn, mesh):
    """``jit(shard_map(vmap(member_fn)))``: each device maps ``member_fn`` over its members."""
    d2l.check_spec(P("model"), mesh)

    def local(state, images, labels):  # state: this device's members
        fn = functools.partial(member_fn, images=images, labels=labels,
                               axis_name=("model", "member"))
        return jax.vmap(fn, axis_name="member")(state)
    return jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P("model"), P(), P()),
                                 out_specs=P("model"), check_vma=False))


def evaluate_stacked(state, data_iter, mesh):
    """Test accuracy of every member of a stacked ensemble (an array) and of the ensemble."""
    count = map_members(d2l.member_num_correct, mesh)
    members, ensemble, n = 0, 0, 0
    for X, y in data_iter:
        members_correct, ensemble_correct = jax.device_get(count(state, *d2l.shard((X, y), mesh)))
        members += members_correct
        ensemble += ensemble_correct[0]  # equal for every member
        n += len(y)
    return members / n, float(ensemble / n)


def train_stacked(state, data, num_epochs, mesh):
    """``train_ensemble``'s loop for a stacked ensemble, one ``map_members`` step per batch."""
    d2l.check_positive(num_epochs=num_epochs)
    step = map_members(member_step, mesh)
    animator = d2l.Animator(xlabel="epoch", ylabel="test accuracy", xlim=[1, num_epochs],
                            legend=["mean member", "ensemble"])
    train_iter = data.get_dataloader(True, drop_last=True)
    for epoch in range(num_epochs):
        for X, y in train_iter:
            state, loss, accuracy = step(state, *d2l.shard((X, y), mesh))
        members, ensemble = evaluate_stacked(state, data.get_dataloader(False), mesh)
        animator.add(epoch + 1, (members.mean(), ensemble))
    return state, members, ensemble
