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
import optax

from . import _checks as check
from .errors import InputError

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
    if optimizer not in OPTIMIZER_STATE_COPIES:
        raise InputError(f"unknown optimizer {optimizer!r}; use one of "
                         f"{sorted(OPTIMIZER_STATE_COPIES)} or add it to "
                         f"OPTIMIZER_STATE_COPIES")
    check.positive(num_params=num_params, bytes_per_value=bytes_per_value)
    check.integer(1, param_shards=param_shards, batch_shards=batch_shards)
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


def gpt_block(p, x, attention=jax.nn.dot_product_attention):
    """A GPT-style block on ``x`` of shape (B, T, d): causal self-attention,
    then an MLP four times as wide, each after a LayerNorm (no scale)."""
    y = jax.nn.standardize(x)
    q, k, v = (jnp.einsum("btd,dhc->bthc", y, p[w]) for w in "qkv")
    a = attention(q, k, v, is_causal=True)
    x = x + jnp.einsum("bthc,hcd->btd", a, p["o"])
    return x + jax.nn.gelu(jax.nn.standardize(x) @ p["up"]) @ p["down"]


def gpt_block_params(d, h):
    """The shapes of a ``gpt_block``'s weights: width ``d``, ``h`` heads."""
    s = lambda *dims: jax.ShapeDtypeStruct(dims, jnp.float32)
    return {"q": s(d, h, d // h), "k": s(d, h, d // h), "v": s(d, h, d // h),
            "o": s(h, d // h, d), "up": s(d, 4 * d), "down": s(4 * d, d)}


def block_bytes(d, h, T, B, block=gpt_block):
    """Bytes one block of a stack saves on B sequences of T tokens: two blocks
    traced less one, so that the block's input counts."""
    p, x = gpt_block_params(d, h), jax.ShapeDtypeStruct((B, T, d), jnp.float32)
    one = saved_activation_bytes(lambda p, x: block(p, x).sum(), p, x)
    two = saved_activation_bytes(lambda p, x: block(p, block(p, x)).sum(), p, x)
    return two - one


def lm_footprint(L, d, h, T, B, V, block=gpt_block):
    """Parameters and saved-activation bytes of a language model of L blocks
    on B sequences of T tokens, with a vocabulary of V tokens."""
    num_params = L * (12 * d * d + 4 * d) + 2 * V * d + T * d + 2 * d
    W, x = (jax.ShapeDtypeStruct(s, jnp.float32) for s in ((d, V), (B, T, d)))
    head = lambda W, x, y: optax.softmax_cross_entropy_with_integer_labels(
        jax.nn.standardize(x) @ W, y).mean()
    act = saved_activation_bytes(head, W, x, jnp.zeros((B, T), jnp.int32))
    return num_params, act + L * block_bytes(d, h, T, B, block)


def _check_count(tree: Any) -> None:
    check.tree(tree, "tree")


def _check_saved(f: Callable[..., Any], *args: Any) -> None:
    if not callable(f):
        raise InputError(f"f must be the function to differentiate, got {f!r}")


count_params = check.validated(count_params, _check_count)
saved_activation_bytes = check.validated(saved_activation_bytes, _check_saved)


def _check_gpt_block(p: dict[str, Any], x: Any,
                     attention: Callable[..., Any] = jax.nn.dot_product_attention) -> None:
    check.tree(p, "p")


def _check_gpt_block_params(d: int, h: int) -> None:
    check.positive(d=d, h=h)
    check.divisible(d, h, "width d", "heads h")


def _check_block_bytes(d: int, h: int, T: int, B: int,
                       block: Callable[..., Any] = gpt_block) -> None:
    _check_gpt_block_params(d, h)
    check.positive(T=T, B=B)


def _check_lm_footprint(L: int, d: int, h: int, T: int, B: int, V: int,
                        block: Callable[..., Any] = gpt_block) -> None:
    _check_block_bytes(d, h, T, B)
    check.positive(L=L, V=V)


lm_footprint = check.validated(lm_footprint, _check_lm_footprint)
block_bytes = check.validated(block_bytes, _check_block_bytes)
gpt_block_params = check.validated(gpt_block_params, _check_gpt_block_params)
gpt_block = check.validated(gpt_block, _check_gpt_block)
