"""A small decoder-only Transformer in Flax NNX whose parameters carry logical
axis names ('embed', 'heads', 'mlp', 'vocab'; its activations 'batch'), and its
loss. ``dtype`` is the precision the layers compute in (default: their
parameters', float32)."""
import flax.core.spmd
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import PartitionSpec as P


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
    """A decoder-only LM; ``remat``: recompute each block; ``dtype``: compute."""

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
