"""Ensembles, one model per device (notebook 08): Flax's ensembling recipe
with ``pmap`` (every device initialises and trains a different CNN on the same
batches; the members' softmax probabilities are averaged with ``lax.pmean``)
and one member's step, whose ``jit(shard_map)`` twin replaces ``pmap``.

The shown functions carry no argument checks; their public names check first
(``check.validated``), so bad input gets a message naming the fix."""
import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import jax_utils
from flax.training.train_state import TrainState
from jax import lax
from jax.typing import ArrayLike

from . import _checks as check
from ._earlier import ensemble as d2l
from .errors import InputError
from .flax_models import _check_linen_batch


def _check_ensemble_size(num_members, num_devices, one_per_device=False):
    """Raise a ValueError naming the fix unless ``num_members`` models fit
    ``num_devices``."""
    if not isinstance(check._number(num_members), int) or num_members < 1:
        raise InputError(f"an ensemble needs a positive number of models, got "
                         f"{num_members!r}")
    if one_per_device and num_members != num_devices:
        raise InputError(
            f"the pmap ensemble puts one model on each device, so it needs as "
            f"many models as devices: got {num_members} keys for {num_devices} "
            f"devices. Pass jax.random.split(rng, {num_devices}), or train "
            f"{num_members} models as a stacked ensemble "
            f"(d2l.create_stacked_ensemble) on a mesh whose 'model' axis "
            f"divides {num_members}")
    try:
        check.divisible(num_members, num_devices, "an ensemble of",
                        "devices of the mesh's 'model' axis")
    except ValueError as e:
        axis = max(d for d in range(1, num_devices + 1)
                   if num_members % d == 0 and num_devices % d == 0)
        raise InputError(
            f"{e} models, or a 'model' axis of {axis} "
            f"device{'s' if axis > 1 else ''} (a divisor of {num_members}), "
            f"e.g. a ({axis}, {num_devices // axis}) mesh with axes "
            f"('model', 'data') that also splits each batch over 'data'"
        ) from None


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


# ----- the checks behind the public names -----

def _check_pmap_keys(rngs: jax.Array, learning_rate: float, momentum: float) -> None:
    _check_ensemble_size(len(rngs), jax.local_device_count(),
                         one_per_device=True)
    check.positive(learning_rate=learning_rate)
    check.nonnegative(momentum=momentum)


def _check_member(state: TrainState, images: ArrayLike, labels: ArrayLike,
                  axis_name: str) -> None:
    _check_linen_batch(state, images, labels)


def _check_members(state: TrainState, images: ArrayLike, labels: ArrayLike, *,
                   axis_name: str = "ensemble") -> None:
    _check_linen_batch(state, images, labels, stacked=1)


def _check_epochs(state: TrainState, data: Any, num_epochs: int) -> None:
    check.positive(num_epochs=num_epochs)


member_step = check.validated(member_step, _check_member)
ensemble_step = check.validated(ensemble_step, _check_members)
create_ensemble_state = check.validated(create_ensemble_state, _check_pmap_keys)
train_ensemble = check.validated(train_ensemble, _check_epochs)
