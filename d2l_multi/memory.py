"""Memory: what one device must hold to train a model -- parameters, gradients, optimizer state
and activations -- and how sharding divides it."""
import math

import jax
import jax.numpy as jnp
from flax import nnx

import d2l_multi as d2l

OPTIMIZER_STATE_COPIES = {"sgd": 0, "momentum": 1, "adam": 2}  # extra arrays per parameter


def count_params(tree):
    """The number of values in all arrays of ``tree`` (a parameter list, dict or nnx.State)."""
    return sum(math.prod(jnp.shape(x)) for x in jax.tree.leaves(tree))


def saved_activation_bytes(f, *args):
    """Bytes of the intermediate values ``jax.grad(f)(*args)`` keeps from its forward pass for
    its backward pass (the activations), not counting the arguments themselves. Only traces."""
    leaves, treedef = jax.tree.flatten(args)
    vjp = lambda *xs: jax.vjp(lambda *ys: f(*jax.tree.unflatten(treedef, ys)), *xs)
    closed, (_, vjp_fn) = jax.make_jaxpr(vjp, return_shape=True)(*leaves)
    residuals = closed.jaxpr.outvars[len(closed.jaxpr.outvars) - len(jax.tree.leaves(vjp_fn)):]
    inputs = set(map(id, closed.jaxpr.invars))
    saved = {id(v): v.aval for v in residuals
             if id(v) not in inputs and hasattr(v.aval, "shape") and not hasattr(v, "val")}
    return sum(math.prod(a.shape) * a.dtype.itemsize for a in saved.values())


def training_memory(num_params, activation_bytes=0, dtype=jnp.float32, optimizer="adam",
                    param_shards=1, batch_shards=1):
    """Bytes one device holds while training: the parameters, their gradients and the
    optimizer's state (each ``dtype``, split ``param_shards`` ways), and the activations
    (the batch split ``batch_shards`` ways). ``optimizer``: a key of OPTIMIZER_STATE_COPIES."""
    if optimizer not in OPTIMIZER_STATE_COPIES:
        raise ValueError(f"unknown optimizer {optimizer!r}; use one of "
                         f"{sorted(OPTIMIZER_STATE_COPIES)} (or add its number of state "
                         f"arrays per parameter to d2l.OPTIMIZER_STATE_COPIES)")
    params = num_params * jnp.dtype(dtype).itemsize / param_shards
    memory = {"parameters": params, "gradients": params,
              "optimizer state": OPTIMIZER_STATE_COPIES[optimizer] * params,
              "activations": activation_bytes / batch_shards}
    memory["total"] = sum(memory.values())
    return memory


def transformer_param_count(num_layers, d_model, vocab_size, seq_len, d_ff=None):
    """Parameters of ``TransformerLM``: embeddings, ``num_layers`` blocks, the output layer."""
    d_ff = 4 * d_model if d_ff is None else d_ff
    block = (4 * d_model * d_model      # query, key, value and output projections
             + 2 * d_model * d_ff       # the MLP's two matrices
             + 2 * 2 * d_model)         # two LayerNorms, each a scale and a bias
    return (num_layers * block + vocab_size * d_model + seq_len * d_model  # token, position
            + 2 * d_model + d_model * vocab_size)       # final LayerNorm, output layer


def transformer_activation_bytes(num_layers, d_model, num_heads, seq_len, batch_size,
                                 vocab_size, d_ff=None, dtype=jnp.float32):
    """A lower bound of the activations ``TransformerLM`` keeps for its backward pass. Per
    token and block: 8 vectors of d_model values (both LayerNorms' inputs and outputs, query,
    key, value, attention output), 2 of d_ff (GELU's input and output) and the attention
    weights (num_heads x seq_len); at the end, the last LayerNorm's input and output, the
    logits and their softmax."""
    d_ff = 4 * d_model if d_ff is None else d_ff
    tokens = batch_size * seq_len
    block = tokens * (8 * d_model + 2 * d_ff + num_heads * seq_len)
    values = num_layers * block + tokens * (2 * d_model + 2 * vocab_size)
    return values * jnp.dtype(dtype).itemsize


def transformer_memory(num_layers, d_model, num_heads, seq_len, batch_size, vocab_size,
                       dtype=jnp.float32, optimizer="adam", param_shards=1, batch_shards=1):
    """``training_memory`` of a ``TransformerLM`` of this size, measured by tracing the model
    and its gradient (no array is created, so any size works). Every block is alike, so the
    model is traced with one and with two blocks and the difference is extrapolated to
    ``num_layers``. Activations of the float32 trace are scaled to ``dtype``."""
    def measure(layers):
        model_fn = lambda: d2l.TransformerLM(vocab_size, seq_len, d_model, num_heads, layers,
                                         rngs=nnx.Rngs(0))
        with nnx.use_eager_sharding(False):
            graphdef, state = nnx.split(nnx.eval_shape(model_fn))
        tokens = jax.ShapeDtypeStruct((batch_size, seq_len), jnp.int32)
        loss = lambda state, X, Y: d2l.lm_loss(nnx.merge(graphdef, state), X, Y)
        return count_params(state), saved_activation_bytes(loss, state, tokens, tokens)

    (params1, act1), (params2, act2) = measure(1), measure(2)
    num_params = params1 + (num_layers - 1) * (params2 - params1)
    activations = (act1 + (num_layers - 1) * (act2 - act1)) * jnp.dtype(dtype).itemsize / 4
    return training_memory(num_params, activations, dtype, optimizer, param_shards,
                           batch_shards)
