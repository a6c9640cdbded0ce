"""A small decoder-only Transformer in Flax NNX whose parameters carry logical sharding names
('batch', 'embed', 'heads', 'mlp', 'vocab'), and its training step."""
import flax.core.spmd
import jax
import jax.numpy as jnp
import optax
from flax import nnx
from jax.sharding import PartitionSpec as P

def logical_constraint(x, names):
    """Lay the activation ``x`` out by logical axis names under the rules of the enclosing
    ``use_sharding`` block; outside one (no mesh or no rules), return ``x`` unchanged."""
    rules = dict(flax.core.spmd.get_logical_axis_rules())
    if not rules or jax.sharding.get_abstract_mesh().empty:
        return x
    return jax.lax.with_sharding_constraint(x, P(*[rules.get(n) if n else None for n in names]))


def logical_init(names):
    """LeCun-normal initialisation whose arrays carry one logical axis name per dimension."""
    return nnx.with_partitioning(nnx.initializers.lecun_normal(), names)


def logical_linear(d_in, d_out, names, *, rngs):
    """A linear layer without bias whose (d_in, d_out) kernel carries the logical ``names``."""
    return nnx.Linear(d_in, d_out, use_bias=False, kernel_init=logical_init(names), rngs=rngs)


class CausalSelfAttention(nnx.Module):
    """Multi-head self-attention where each position sees only itself and earlier positions.
    The query/key/value matrices split their output columns by head ('heads'), the output
    matrix its input rows: with 'heads' on a mesh axis each device computes whole heads."""

    def __init__(self, d_model, num_heads, *, rngs):
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} must be a multiple of num_heads={num_heads}")
        self.num_heads = num_heads
        self.query, self.key, self.value = (
            logical_linear(d_model, d_model, ("embed", "heads"), rngs=rngs) for _ in range(3))
        self.out = logical_linear(d_model, d_model, ("heads", "embed"), rngs=rngs)

    def __call__(self, x):
        B, T, D = x.shape
        heads = lambda y: y.reshape(B, T, self.num_heads, D // self.num_heads)
        q, k, v = heads(self.query(x)), heads(self.key(x)), heads(self.value(x))
        scores = jnp.einsum("bthd,bshd->bhts", q, k) / jnp.sqrt(D // self.num_heads)
        causal = jnp.tril(jnp.ones((T, T), dtype=bool))
        weights = jax.nn.softmax(jnp.where(causal, scores, -1e9), axis=-1)
        return self.out(jnp.einsum("bhts,bshd->bthd", weights, v).reshape(B, T, D))


class MLP(nnx.Module):
    """Two matrices with a GELU between. Megatron's split: the first by columns ('mlp' on its
    output), the second by rows ('mlp' on its input), so the hidden layer never moves."""

    def __init__(self, d_model, d_ff, *, rngs):
        self.up = logical_linear(d_model, d_ff, ("embed", "mlp"), rngs=rngs)
        self.down = logical_linear(d_ff, d_model, ("mlp", "embed"), rngs=rngs)

    def __call__(self, x):
        return self.down(jax.nn.gelu(self.up(x)))


class TransformerBlock(nnx.Module):
    """A pre-LayerNorm Transformer block: x + attention(norm(x)), then x + MLP(norm(x)).
    LayerNorm parameters carry no sharding names: they are small and stay replicated."""

    def __init__(self, d_model, num_heads, d_ff, *, rngs):
        self.norm1 = nnx.LayerNorm(d_model, rngs=rngs)
        self.attention = CausalSelfAttention(d_model, num_heads, rngs=rngs)
        self.norm2 = nnx.LayerNorm(d_model, rngs=rngs)
        self.mlp = MLP(d_model, d_ff, rngs=rngs)

    def __call__(self, x):
        x = logical_constraint(x, ("batch", None, None))  # activations: split by examples
        x = x + self.attention(self.norm1(x))
        return x + self.mlp(self.norm2(x))


class TransformerLM(nnx.Module):
    """A decoder-only language model: token and position embeddings, ``num_layers`` blocks,
    a final LayerNorm and a linear layer to next-token logits."""

    def __init__(self, vocab_size, seq_len, d_model=64, num_heads=8, num_layers=2, d_ff=None,
                 *, rngs):
        d_ff = 4 * d_model if d_ff is None else d_ff
        self.embed = nnx.Embed(vocab_size, d_model, rngs=rngs,
                               embedding_init=logical_init(("vocab", "embed")))
        self.position = nnx.Param(0.02 * jax.random.normal(rngs.params(), (seq_len, d_model)),
                                  out_sharding=(None, "embed"))
        self.blocks = nnx.List([TransformerBlock(d_model, num_heads, d_ff, rngs=rngs)
                                for _ in range(num_layers)])
        self.norm = nnx.LayerNorm(d_model, rngs=rngs)
        self.head = logical_linear(d_model, vocab_size, ("embed", "vocab"), rngs=rngs)

    def __call__(self, tokens):
        x = self.embed(tokens) + self.position[:tokens.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def lm_loss(model, X, Y):
    """Mean cross-entropy of the model's next-token logits for inputs X against targets Y."""
    return optax.softmax_cross_entropy_with_integer_labels(model(X), Y).mean()


@nnx.jit
def lm_train_step(model, optimizer, X, Y):
    """One optimizer step on the batch (X, Y). Nothing here names a device: the layouts of the
    model, the optimizer state and the batch decide how the compiler parallelises it."""
    loss, grads = nnx.value_and_grad(lm_loss)(model, X, Y)
    optimizer.update(model, grads)
    if not jax.sharding.get_abstract_mesh().empty:  # keep the layouts the state came in with;
        state = nnx.state((model, optimizer))      # with Auto axes XLA may pick others
        nnx.update((model, optimizer),
                   jax.lax.with_sharding_constraint(state, nnx.get_partition_spec(state)))
    return loss
