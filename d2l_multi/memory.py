"""Memory: what one device must hold to train a model -- parameters, gradients,
optimizer state and saved activations (``print_saved_residuals`` lists them) --
and how sharding and rematerialisation divide it."""
import contextlib
import io
import math
import re
from collections.abc import Callable
from typing import Any

import jax
import jax.ad_checkpoint
import jax.numpy as jnp
from flax import nnx

from . import _checks as check
from .errors import InputError
from .transformer import TransformerLM, lm_loss

OPTIMIZER_STATE_COPIES = {"sgd": 0, "momentum": 1, "adam": 2}  # per parameter


def count_params(tree):
    """The number of values in the arrays of ``tree`` (a list, dict, State)."""
    return sum(math.prod(jnp.shape(x)) for x in jax.tree.leaves(tree))


def training_memory(num_params, activation_bytes=0, optimizer="adam",
                    param_shards=1, batch_shards=1, bytes_per_value=4):
    """Bytes per device of parameters, gradients, optimizer state, activations,
    and their total."""
    params = num_params * bytes_per_value / param_shards
    memory = {"parameters": params, "gradients": params,
              "optimizer state": OPTIMIZER_STATE_COPIES[optimizer] * params,
              "activations": activation_bytes / batch_shards}
    return {**memory, "total": sum(memory.values())}


def _check_training_memory(num_params: int, activation_bytes: float = 0,
                           optimizer: str = "adam", param_shards: int = 1,
                           batch_shards: int = 1, bytes_per_value: int = 4) -> None:
    """Raise a ValueError unless ``optimizer`` is in ``OPTIMIZER_STATE_COPIES``,
    the sizes are > 0 and the activations >= 0 (``training_memory``'s
    arguments)."""
    if optimizer not in OPTIMIZER_STATE_COPIES:
        raise InputError(f"unknown optimizer {optimizer!r}; use one of "
                         f"{sorted(OPTIMIZER_STATE_COPIES)} or add it to "
                         f"OPTIMIZER_STATE_COPIES")
    check.positive(num_params=num_params, param_shards=param_shards,
                   batch_shards=batch_shards,
                   bytes_per_value=bytes_per_value)
    check.nonnegative(activation_bytes=activation_bytes)


training_memory = check.validated(training_memory, _check_training_memory)


def saved_activation_bytes(f, *args):
    """Bytes the backward pass of ``f(*args)`` saves, less ``f``'s arguments;
    it only traces, so ``args`` may be shapes (``jax.ShapeDtypeStruct``)."""
    listing = io.StringIO()
    with contextlib.redirect_stdout(listing):
        jax.ad_checkpoint.print_saved_residuals(f, *args)
    saved = [line for line in listing.getvalue().splitlines()
             if "from the argument" not in line]
    shapes = [re.match(r"[a-z]+(\d*)\[([\d,]*)\]", line).groups()
              for line in saved]  # 'f32[4,5]' -> ('32', '4,5')
    return sum(math.prod(int(n) for n in dims.split(",") if n)
               * int(bits or 8) // 8  # bool has no bits: one byte
               for bits, dims in shapes)


def transformer_footprint(num_layers, d_model, num_heads, seq_len, batch_size,
                          vocab_size, remat=False):
    """Parameters and saved-activation bytes of a ``TransformerLM`` on a batch,
    from shapes alone: one and two blocks are traced, the rest extrapolated."""

    def measure(layers, remat):
        with nnx.use_eager_sharding(False):  # shapes only: no arrays, no mesh
            model = nnx.eval_shape(lambda: TransformerLM(
                vocab_size, seq_len, d_model, num_heads, layers, remat=remat,
                rngs=nnx.Rngs(0)))
        tokens = jax.ShapeDtypeStruct((batch_size, seq_len), jnp.int32)
        return (count_params(model),
                saved_activation_bytes(lm_loss, model, tokens, tokens))

    (params1, act1), (params2, act2) = measure(1, remat), measure(2, remat)
    activations = act1 + (num_layers - 1) * (act2 - act1)
    if remat:  # plus the activations of the one block being recomputed
        activations += measure(2, False)[1] - measure(1, False)[1]
    return params1 + (num_layers - 1) * (params2 - params1), activations


def _check_transformer_footprint(num_layers: int, d_model: int, num_heads: int,
                                 seq_len: int, batch_size: int, vocab_size: int,
                                 remat: bool = False) -> None:
    """Raise a ValueError unless the layers and the batch size are > 0."""
    check.positive(num_layers=num_layers, batch_size=batch_size)


def _check_count(tree: Any) -> None:
    check.tree(tree, "tree")


def _check_saved(f: Callable[..., Any], *args: Any) -> None:
    if not callable(f):
        raise InputError(f"f must be the function to differentiate, got {f!r}")


transformer_footprint = check.validated(transformer_footprint,
                                        _check_transformer_footprint)
count_params = check.validated(count_params, _check_count)
saved_activation_bytes = check.validated(saved_activation_bytes, _check_saved)
