"""Keras 3 on JAX, data parallel: the Keras guide's convnet, its variables as a JAX train state,
and a stateless training step that ``jax.jit`` parallelises over a sharded batch.

Keras reads ``KERAS_BACKEND`` when it is first imported, so nothing here imports keras at module
import time: set ``os.environ['KERAS_BACKEND'] = 'jax'`` first, then call these functions.
"""
import os
import sys
from collections.abc import Callable
from typing import Any

import jax

from . import _checks as check
from .errors import InputError


def keras_convnet():
    """The convnet of Keras' guide to distributed training with JAX."""
    import keras
    layers = keras.layers
    inputs = keras.Input(shape=(28, 28, 1))
    x = layers.Conv2D(12, 3, padding="same", use_bias=False)(inputs)
    x = layers.ReLU()(layers.BatchNormalization(scale=False, center=True)(x))
    x = layers.Conv2D(24, 6, strides=2, use_bias=False)(x)
    x = layers.ReLU()(layers.BatchNormalization(scale=False, center=True)(x))
    x = layers.Conv2D(32, 6, padding="same", strides=2)(x)
    x = layers.ReLU()(layers.BatchNormalization(scale=False, center=True)(x))
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dense(256, activation="relu")(x)
    x = layers.Dropout(0.5)(x)
    outputs = layers.Dense(10)(x)  # logits
    return keras.Model(inputs, outputs)


def keras_train_state(model, optimizer):
    """The values: (trainable, non-trainable, optimizer variables)."""
    optimizer.build(model.trainable_variables)
    return tuple([v.value for v in variables] for variables in (
        model.trainable_variables, model.non_trainable_variables,
        optimizer.variables))


def make_keras_train_step(model, loss_fn, optimizer):
    """A jitted stateless step, ``train_step(state, X, y) -> (loss, state)``."""
    def compute_loss(trainable, non_trainable, X, y):
        y_pred, non_trainable = model.stateless_call(
            trainable, non_trainable, X, training=True)
        return loss_fn(y, y_pred), non_trainable

    @jax.jit
    def train_step(state, X, y):
        trainable, non_trainable, optimizer_variables = state
        grad_fn = jax.value_and_grad(compute_loss, has_aux=True)
        (loss, non_trainable), grads = grad_fn(trainable, non_trainable, X, y)
        trainable, optimizer_variables = optimizer.stateless_apply(
            optimizer_variables, grads, trainable)
        return loss, (trainable, non_trainable, optimizer_variables)
    return train_step


def keras_assign_state(model, optimizer, state):
    """Write a train state back into the Keras model and optimizer: a copy,
    on one device."""
    variables = (model.trainable_variables + model.non_trainable_variables
                 + optimizer.variables)
    device = jax.devices()[0]
    for variable, value in zip(variables, jax.tree.leaves(state)):
        variable.assign(jax.device_put(value, device, may_alias=False))


# ----- the checks behind the public names: Keras must run on JAX -----

def _check_backend() -> None:
    """Raise an InputError unless Keras runs (or will run) on JAX: it reads KERAS_BACKEND
    once, at its first import."""
    keras = sys.modules.get("keras")
    backend = keras.backend.backend() if keras else os.environ.get("KERAS_BACKEND", "jax")
    if backend != "jax":
        where = f"Keras runs on {backend!r}" if keras else f"KERAS_BACKEND={backend!r}"
        raise InputError(f"{where}, but these functions need 'jax': set os.environ["
                         f"'KERAS_BACKEND'] = 'jax' before Keras is first imported (restart "
                         f"the kernel if it was)")


def _check_state(model: Any, optimizer: Any) -> None:
    _check_backend()


def _check_step(model: Any, loss_fn: Callable[..., Any], optimizer: Any) -> None:
    _check_backend()
    if not callable(loss_fn):
        raise InputError(f"loss_fn must be a Keras loss, e.g. keras.losses."
                         f"SparseCategoricalCrossentropy(from_logits=True), got {loss_fn!r}")


def _check_assign(model: Any, optimizer: Any, state: tuple[Any, Any, Any]) -> None:
    _check_backend()
    check.tree(state, "state")


keras_convnet = check.validated(keras_convnet, _check_backend)
keras_train_state = check.validated(keras_train_state, _check_state)
make_keras_train_step = check.validated(make_keras_train_step, _check_step)
keras_assign_state = check.validated(keras_assign_state, _check_assign)
