"""Sharding beyond data parallelism: how much memory training needs per device, a 2-D
``('data', 'model')`` mesh, a small Flax NNX Transformer whose parameters carry logical sharding
names, and the rules that map those names to mesh axes -- data parallelism, fully-sharded data
parallelism (FSDP), tensor parallelism (TP) and their mixes differ only in the rules."""
import contextlib
import math
import re

import flax.core.spmd
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx
from jax.sharding import AxisType, NamedSharding, PartitionSpec as P

import d2l_multi as d2l

__all__ = ["COLLECTIVES", "LOGICAL_AXES", "MLP", "OPTIMIZER_STATE_COPIES", "STRATEGIES",
           "TINY_TEXT", "CausalSelfAttention", "CharCorpus", "TransformerBlock", "TransformerLM",
           "abstract_state", "bytes_per_device", "check_layout", "check_rules",
           "count_collectives", "count_params", "create_sharded", "device_mesh", "lm_loss",
           "lm_train_step", "logical_constraint", "logical_init", "logical_linear", "reshard",
           "saved_activation_bytes", "shard_tokens", "sharding_rules", "training_memory",
           "transformer_activation_bytes", "transformer_memory", "transformer_param_count",
           "use_sharding"]

# --- Memory: what one device must hold to train a model -------------------------------------

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


# --- A tiny next-token task, bundled with the package (no download) ------------------------

TINY_TEXT = (  # Lewis Carroll, Alice's Adventures in Wonderland (1865), public domain
    "Alice was beginning to get very tired of sitting by her sister on the bank, and of "
    "having nothing to do: once or twice she had peeped into the book her sister was reading, "
    "but it had no pictures or conversations in it, 'and what is the use of a book,' thought "
    "Alice 'without pictures or conversations?' So she was considering in her own mind (as "
    "well as she could, for the hot day made her feel very sleepy and stupid), whether the "
    "pleasure of making a daisy-chain would be worth the trouble of getting up and picking the "
    "daisies, when suddenly a White Rabbit with pink eyes ran close by her. There was nothing "
    "so very remarkable in that; nor did Alice think it so very much out of the way to hear "
    "the Rabbit say to itself, 'Oh dear! Oh dear! I shall be late!' (when she thought it over "
    "afterwards, it occurred to her that she ought to have wondered at this, but at the time "
    "it all seemed quite natural); but when the Rabbit actually took a watch out of its "
    "waistcoat-pocket, and looked at it, and then hurried on, Alice started to her feet, for "
    "it flashed across her mind that she had never before seen a rabbit with either a "
    "waistcoat-pocket, or a watch to take out of it, and burning with curiosity, she ran "
    "across the field after it, and fortunately was just in time to see it pop down a large "
    "rabbit-hole under the hedge.")


class CharCorpus:
    """Character-level language modelling on ``text``: batches of random windows, the targets
    shifted one character to the right. The vocabulary is padded to a multiple of
    ``vocab_multiple`` so that it splits evenly over a mesh axis."""

    def __init__(self, batch_size=16, seq_len=32, text=TINY_TEXT, vocab_multiple=8, seed=0):
        if len(text) <= seq_len + 1:
            raise ValueError(f"the text has {len(text)} characters, too few for windows of "
                             f"seq_len + 1 = {seq_len + 1}; use a shorter seq_len or more text")
        self.batch_size, self.seq_len, self.seed = batch_size, seq_len, seed
        self.vocab = sorted(set(text))
        self.vocab_size = -(-len(self.vocab) // vocab_multiple) * vocab_multiple
        self.tokens = self.encode(text)

    def encode(self, text):
        index = {c: i for i, c in enumerate(self.vocab)}
        return np.array([index[c] for c in text], dtype=np.int32)

    def decode(self, ids):
        return "".join(self.vocab[i] if i < len(self.vocab) else "?" for i in np.asarray(ids))

    def batch(self, step):
        """Batch number ``step`` (the same every time): inputs X and targets Y, each
        (batch_size, seq_len) int32."""
        rng = np.random.default_rng((self.seed, step))
        starts = rng.integers(0, len(self.tokens) - self.seq_len - 1, self.batch_size)
        windows = np.stack([self.tokens[s:s + self.seq_len + 1] for s in starts])
        return windows[:, :-1], windows[:, 1:]


# --- A Transformer in Flax NNX whose parameters carry logical sharding names --------------

LOGICAL_AXES = ("batch", "embed", "heads", "mlp", "vocab")


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


def transformer_memory(num_layers, d_model, num_heads, seq_len, batch_size, vocab_size,
                       dtype=jnp.float32, optimizer="adam", param_shards=1, batch_shards=1):
    """``training_memory`` of a ``TransformerLM`` of this size, measured by tracing the model
    and its gradient (no array is created, so any size works). Every block is alike, so the
    model is traced with one and with two blocks and the difference is extrapolated to
    ``num_layers``. Activations of the float32 trace are scaled to ``dtype``."""
    def measure(layers):
        model_fn = lambda: TransformerLM(vocab_size, seq_len, d_model, num_heads, layers,
                                         rngs=nnx.Rngs(0))
        with nnx.use_eager_sharding(False):
            graphdef, state = nnx.split(nnx.eval_shape(model_fn))
        tokens = jax.ShapeDtypeStruct((batch_size, seq_len), jnp.int32)
        loss = lambda state, X, Y: lm_loss(nnx.merge(graphdef, state), X, Y)
        return count_params(state), saved_activation_bytes(loss, state, tokens, tokens)

    (params1, act1), (params2, act2) = measure(1), measure(2)
    num_params = params1 + (num_layers - 1) * (params2 - params1)
    activations = (act1 + (num_layers - 1) * (act2 - act1)) * jnp.dtype(dtype).itemsize / 4
    return training_memory(num_params, activations, dtype, optimizer, param_shards,
                           batch_shards)


# --- Meshes, rules and sharded creation ------------------------------------------------------

STRATEGIES = {  # name: (mesh shape over ('data', 'model'), -1 = the remaining devices;
                #        logical axis -> mesh axis; the logical axes not named are replicated)
    "dp": ((-1, 1), {"batch": "data"}),
    "fsdp": ((-1, 1), {"batch": "data", "embed": "data"}),
    "tp": ((1, -1), {"heads": "model", "mlp": "model", "vocab": "model"}),
    "dp+tp": ((2, -1), {"batch": "data", "heads": "model", "mlp": "model", "vocab": "model"}),
    "fsdp+tp": ((2, -1), {"batch": "data", "embed": "data",
                          "heads": "model", "mlp": "model", "vocab": "model"}),
}


def sharding_rules(strategy):
    """The mesh shape and the complete rules (every logical axis, None = replicated) of one of
    ``STRATEGIES``: the one place where DP, FSDP, TP and their mixes differ."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; use one of {list(STRATEGIES)}")
    shape, rules = STRATEGIES[strategy]
    return shape, {axis: rules.get(axis) for axis in LOGICAL_AXES}


def device_mesh(shape, axis_names=("data", "model"), devices=None):
    """A mesh of ``devices`` (default: all) with Auto axes; one size in ``shape`` may be -1,
    meaning 'the remaining devices', e.g. (2, -1) on 8 devices is (2, 4)."""
    devices = d2l.devices() if devices is None else list(devices)
    n, shape = len(devices), tuple(shape)
    if len(shape) != len(axis_names):
        raise ValueError(f"mesh shape {shape} has {len(shape)} axes but axis_names "
                         f"{tuple(axis_names)} has {len(axis_names)}; give one size per name")
    known = math.prod(s for s in shape if s != -1)
    if shape.count(-1) == 1 and known > 0 and n % known == 0:
        shape = tuple(n // known if s == -1 else s for s in shape)
    if shape.count(-1) or math.prod(shape) != n or min(shape) < 1:
        examples = ", ".join(str((a, n // a)) for a in range(1, n + 1) if n % a == 0)
        raise ValueError(
            f"a mesh of shape {shape} needs {math.prod(shape)} devices but there are {n}; "
            f"choose axis sizes whose product is {n}, e.g. {examples}, or write -1 for one "
            f"axis to give it the remaining devices, e.g. (2, -1)")
    return jax.make_mesh(shape, tuple(axis_names), axis_types=(AxisType.Auto,) * len(shape),
                         devices=devices)


def check_rules(rules, mesh):
    """Check that every rule maps a logical axis to None or to axes that ``mesh`` has."""
    for logical, target in rules.items():
        axes = target if isinstance(target, tuple) else (target,)
        missing = [a for a in axes if a is not None and a not in mesh.axis_names]
        if missing:
            raise ValueError(
                f"the rule {logical!r}: {target!r} names the mesh axis {missing[0]!r}, but the "
                f"mesh has only the axes {tuple(mesh.axis_names)}; map {logical!r} to one of "
                f"those, or to None to replicate it")


def check_layout(state, rules, mesh):
    """Check that every logical axis name on ``state``'s variables has a rule and that every
    dimension splits evenly over the mesh axes its rule names."""
    flat = jax.tree_util.tree_leaves_with_path(
        state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    for path, var in flat:
        names = var.get_metadata().get("out_sharding") or ()
        for name in names:
            if name is not None and name not in rules and name not in mesh.axis_names:
                raise ValueError(
                    f"parameter {jax.tree_util.keystr(path)} is annotated with the logical "
                    f"axis {name!r}, which the rules do not map; add {name!r}: None "
                    f"(replicate) or {name!r}: <a mesh axis> to the rules")
        spec = P(*[rules.get(name, name) if name is not None else None for name in names])
        try:
            d2l.check_spec(spec, mesh, var.shape)
        except ValueError as e:
            raise ValueError(f"parameter {jax.tree_util.keystr(path)}: {e}") from None


def abstract_state(model_fn, mesh, rules):
    """The state of ``model_fn()`` as ``jax.ShapeDtypeStruct`` leaves that carry their
    ``NamedSharding`` on ``mesh`` under ``rules`` -- shapes and layouts, no arrays. It is what
    ``create_sharded`` will build, and the target an Orbax restore lays the values out on.
    ``model_fn``: a function of no arguments returning an NNX Module (or an nnx.Optimizer,
    or a tuple of them)."""
    check_rules(rules, mesh)
    with nnx.use_eager_sharding(False):  # only the shapes and the annotations
        state = nnx.state(nnx.eval_shape(model_fn))
    check_layout(state, rules, mesh)
    with use_sharding(mesh, rules):
        shardings = nnx.get_named_sharding(state, mesh)
    return jax.tree.map(lambda a, s: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=s),
                        state, shardings)


def create_sharded(model_fn, mesh, rules, optimizer=None):
    """Build ``model_fn()`` directly in its sharded layout: created inside ``nnx.jit``, each
    device only ever holds its own shards. With an optax ``optimizer``, return the model and
    an ``nnx.Optimizer`` whose state is laid out like the parameters."""
    abstract_state(model_fn, mesh, rules)  # fails early, naming the parameter and the fix

    @nnx.jit
    def create():
        model = model_fn()
        state = nnx.state(model)
        nnx.update(model, jax.lax.with_sharding_constraint(state, nnx.get_partition_spec(state)))
        if optimizer is None:
            return model
        return model, nnx.Optimizer(model, optimizer, wrt=nnx.Param)

    with use_sharding(mesh, rules):
        return create()


@contextlib.contextmanager
def use_sharding(mesh, rules):
    """Within this block, ``mesh`` is the current mesh and ``rules`` map logical axis names
    to its axes: jitted code traced here (``lm_train_step``) lays its arrays out by them."""
    check_rules(rules, mesh)
    with jax.set_mesh(mesh), nnx.logical_axis_rules(tuple(rules.items())):
        yield


def reshard(node, mesh, rules):
    """A copy of ``node`` (a Module or an nnx.Optimizer) laid out on ``mesh`` by ``rules``: its
    arrays move between devices as the new layout asks, and its values stay the same."""
    check_rules(rules, mesh)
    graphdef, state = nnx.split(node)
    with use_sharding(mesh, rules):
        check_layout(state, rules, mesh)
        shardings = nnx.get_named_sharding(state, mesh)
    return nnx.merge(graphdef, jax.device_put(state, shardings))


def shard_tokens(X, Y, mesh, rules):
    """Lay a batch of token ids out as the rules say for the logical axis 'batch'."""
    spec = P(rules.get("batch"))
    d2l.check_spec(spec, mesh, np.shape(X))
    return jax.device_put((X, Y), NamedSharding(mesh, spec))


# --- Measuring the layout: bytes per device and the collectives in the program ------------

COLLECTIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")


def bytes_per_device(tree):
    """How many bytes of ``tree``'s arrays each device holds: {device: bytes}."""
    held = {}
    for x in jax.tree.leaves(tree):
        for s in x.addressable_shards:
            held[s.device] = held.get(s.device, 0) + s.data.nbytes
    return held


def count_collectives(hlo_text):
    """How many of each collective a compiled program (``compiled.as_text()``) runs; the
    asynchronous ``-start``/``-done`` pairs of GPUs and TPUs count once."""
    counts = dict.fromkeys(COLLECTIVES, 0)
    for op in re.findall(r"\b(" + "|".join(COLLECTIVES) + r")(?:-start)?\(", hlo_text):
        counts[op] += 1
    return counts
