"""A small decoder-only Transformer in Flax NNX whose parameters carry logical
axis names ('embed', 'heads', 'mlp', 'vocab'; its activations 'batch'), and its
loss. ``dtype`` is the precision the layers compute in (default: their
parameters', float32)."""
from collections.abc import Sequence

import flax.core.spmd
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import PartitionSpec as P
from jax.typing import ArrayLike, DTypeLike

from . import _checks as check
from .errors import InputError


def logical_init(names):
    """LeCun-normal initialisation; arrays carry one logical name per axis."""
    return nnx.with_partitioning(nnx.initializers.lecun_normal(), names)


def logical_linear(d_in, d_out, names, *, rngs, dtype=None):
    """A linear layer, no bias, whose (d_in, d_out) kernel carries ``names``."""
    return nnx.Linear(d_in, d_out, use_bias=False, dtype=dtype,
                      kernel_init=logical_init(names), rngs=rngs)


def logical_constraint(x, names):
    """Lay the activation ``x`` out by logical names under the rules in use."""
    rules = dict(flax.core.spmd.get_logical_axis_rules())
    if not rules or jax.sharding.get_abstract_mesh().empty:
        return x
    spec = P(*[rules.get(n) if n else None for n in names])
    return jax.lax.with_sharding_constraint(x, spec)


class CausalSelfAttention(nnx.MultiHeadAttention):
    """Flax's multi-head self-attention with a causal mask."""

    def __init__(self, d_model, num_heads, *, rngs, dtype=None):
        super().__init__(
            num_heads, d_model, use_bias=False, decode=False, dtype=dtype,
            rngs=rngs,
            kernel_init=logical_init(("embed", "heads", None)),
            out_kernel_init=logical_init(("heads", None, "embed")))

    def __call__(self, x):
        return super().__call__(x, mask=nnx.make_causal_mask(x[..., 0]))


class MLP(nnx.Module):
    """Two matrices with a GELU between them."""

    def __init__(self, d_model, d_ff, *, rngs, dtype=None):
        self.up = logical_linear(d_model, d_ff, ("embed", "mlp"), rngs=rngs,
                                 dtype=dtype)
        self.down = logical_linear(d_ff, d_model, ("mlp", "embed"), rngs=rngs,
                                   dtype=dtype)

    def __call__(self, x):
        return self.down(jax.nn.gelu(self.up(x)))


class TransformerBlock(nnx.Module):
    """A pre-LayerNorm block: x + attention(norm(x)), then x + MLP(norm(x))."""

    def __init__(self, d_model, num_heads, d_ff=None, *, rngs, dtype=None):
        self.norm1 = nnx.LayerNorm(d_model, dtype=dtype, rngs=rngs)  # no names
        self.attention = CausalSelfAttention(d_model, num_heads, rngs=rngs,
                                             dtype=dtype)
        self.norm2 = nnx.LayerNorm(d_model, dtype=dtype, rngs=rngs)
        self.mlp = MLP(d_model, d_ff or 4 * d_model, rngs=rngs, dtype=dtype)

    def __call__(self, x):
        x = logical_constraint(x, ("batch", None, None))  # split by examples
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TransformerLM(nnx.Module):
    """A decoder-only LM; ``remat``: recompute blocks; ``dtype``: compute."""

    def __init__(self, vocab_size, seq_len, d_model=64, num_heads=8,
                 num_layers=2, d_ff=None, remat=False, *, rngs, dtype=None):
        self.remat = remat
        self.embed = nnx.Embed(vocab_size, d_model, rngs=rngs, dtype=dtype,
                               embedding_init=logical_init(("vocab", "embed")))
        self.position = nnx.Param(
            0.02 * jax.random.normal(rngs.params(), (seq_len, d_model)),
            out_sharding=(None, "embed"))
        self.blocks = nnx.List([
            TransformerBlock(d_model, num_heads, d_ff, rngs=rngs, dtype=dtype)
            for _ in range(num_layers)])
        self.norm = nnx.LayerNorm(d_model, dtype=dtype, rngs=rngs)
        self.head = logical_linear(d_model, vocab_size, ("embed", "vocab"),
                                   rngs=rngs, dtype=dtype)

    def __call__(self, tokens):
        x = self.embed(tokens)  # in the embedding's dtype
        x = x + self.position[:tokens.shape[1]].astype(x.dtype)
        apply = lambda block, x: block(x)
        for block in self.blocks:
            x = (nnx.remat(apply) if self.remat else apply)(block, x)
        return self.head(self.norm(x))


def lm_loss(model, X, Y):
    """Mean next-token cross-entropy, in float32 whatever the model's dtype."""
    logits = model(X).astype(jnp.float32)
    return optax.softmax_cross_entropy_with_integer_labels(logits, Y).mean()


# ----- the checks behind the public names -----

Names = Sequence[str | None]  # one logical axis name (or None) per axis


def _check_names(names: Names) -> None:
    if isinstance(names, str) or not all(n is None or isinstance(n, str) for n in names):
        raise InputError(f"names must be a tuple of logical axis names (or None), one per "
                         f"axis, e.g. ('embed', 'mlp'), got {names!r}")


def _check_linear(d_in: int, d_out: int, names: Names, *, rngs: nnx.Rngs,
                  dtype: DTypeLike | None = None) -> None:
    check.integer(1, d_in=d_in, d_out=d_out)
    _check_names(names)


def _check_constraint(x: ArrayLike, names: Names) -> None:
    _check_names(names)
    if len(names) != jnp.ndim(x):
        raise InputError(f"names {tuple(names)} has {len(names)} entries but x has "
                         f"{jnp.ndim(x)} axes; give one name (or None) per axis")


def _check_heads(d_model: int, num_heads: int) -> None:
    check.integer(1, d_model=d_model, num_heads=num_heads)
    if d_model % num_heads:
        raise InputError(f"d_model={d_model} does not split into num_heads={num_heads} "
                         f"heads; use a d_model that num_heads divides, e.g. "
                         f"{d_model - d_model % num_heads or num_heads}")


def _check_attention(d_model: int, num_heads: int, *, rngs: nnx.Rngs,
                     dtype: DTypeLike | None = None) -> None:
    _check_heads(d_model, num_heads)


def _check_mlp(d_model: int, d_ff: int, *, rngs: nnx.Rngs,
               dtype: DTypeLike | None = None) -> None:
    check.integer(1, d_model=d_model, d_ff=d_ff)


def _check_block(d_model: int, num_heads: int, d_ff: int | None = None, *, rngs: nnx.Rngs,
                 dtype: DTypeLike | None = None) -> None:
    _check_heads(d_model, num_heads)
    check.integer(1, none=True, d_ff=d_ff)


def _check_lm(vocab_size: int, seq_len: int, d_model: int = 64, num_heads: int = 8,
              num_layers: int = 2, d_ff: int | None = None, remat: bool = False, *,
              rngs: nnx.Rngs, dtype: DTypeLike | None = None) -> None:
    check.integer(1, vocab_size=vocab_size, seq_len=seq_len, num_layers=num_layers)
    _check_block(d_model, num_heads, d_ff, rngs=rngs)


def _check_tokens_batch(model: nnx.Module, X: ArrayLike, Y: ArrayLike) -> None:
    """Refuse token ids that are not (batch, length) integers below the model's
    vocabulary, or inputs and targets of different shapes."""
    if jnp.shape(X) != jnp.shape(Y) or jnp.ndim(X) != 2:
        raise InputError(f"X and Y must be token ids of one shape (batch, length), got "
                         f"{jnp.shape(X)} and {jnp.shape(Y)}")
    vocab = getattr(getattr(model, "embed", None), "num_embeddings", None)
    for name, tokens in (("X", X), ("Y", Y)):
        check.labels(tokens, vocab, name, stacked=1)


logical_linear = check.validated(logical_linear, _check_linear)
logical_constraint = check.validated(logical_constraint, _check_constraint)
logical_init = check.validated(logical_init, _check_names)
CausalSelfAttention = check.validated(CausalSelfAttention, _check_attention)
MLP = check.validated(MLP, _check_mlp)
TransformerBlock = check.validated(TransformerBlock, _check_block)
TransformerLM = check.validated(TransformerLM, _check_lm)
lm_loss = check.validated(lm_loss, _check_tokens_batch)
