"""Mixed precision (notebook 07c): the gradient all-reduce of the mixed-precision step moves half
the bytes of the float32 one (read from the partitioned HLO), training in mixed precision
reaches the float32 accuracy within the stated tolerance, bfloat16 weights without float32
master weights lose small updates, and bad input is refused with the fix."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

import d2l_multi as d2l


@pytest.fixture(scope="module")
def mesh():
    return d2l.device_mesh()


@pytest.fixture(scope="module")
def lenet_args(mesh):
    """LeNet's parameters, Adam's state and a batch of 64, laid out data parallel."""
    params = d2l.init_lenet_params(jax.random.key(0))
    X = jax.random.uniform(jax.random.key(1), (64, 28, 28, 1))
    y = jnp.arange(64) % 10
    adam = optax.adam(1e-3)
    return params, adam, (*d2l.shard((params, adam.init(params)), mesh),
                          *d2l.shard_batch(X, y, mesh))


@pytest.fixture(scope="module")
def lenet_steps(lenet_args):
    """The float32 and the mixed-precision steps, lowered once for the tests below."""
    _, adam, args = lenet_args
    return {"float32": d2l.make_train_step(adam, d2l.mixed_loss_fn).lower(*args),
            "mixed": d2l.make_mixed_precision_step(adam, d2l.mixed_loss_fn).lower(*args)}


def test_mixed_gradient_allreduce_moves_half_the_bytes(lenet_args, lenet_steps):
    """Read from the partitioned program: float32 gradients and the loss in the float32
    step; bfloat16 gradients (the cast to float32 comes after the reduction) and the loss
    in the mixed one. A second read of the same program must come from the compiler again,
    not from the tests' persistent compilation cache (whose key ignores dump options)."""
    n = sum(p.size for p in lenet_args[0])
    asked32 = d2l.allreduce_bytes(d2l.partitioned_hlo(lenet_steps["float32"]))
    asked16 = d2l.allreduce_bytes(d2l.partitioned_hlo(lenet_steps["mixed"]))
    assert asked32 == {"f32": 4 * n + 4}            # 4 bytes a gradient, and the loss
    assert asked16 == {"bf16": 2 * n, "f32": 4}     # the gradients in bfloat16
    assert 2 * asked16["bf16"] == asked32["f32"] - asked16["f32"]
    again = d2l.partitioned_hlo(lenet_steps["mixed"])
    assert "all-reduce(" in again and d2l.allreduce_bytes(again) == asked16


def test_xla_cpu_runs_the_bfloat16_allreduce_in_float32(lenet_steps):
    """What the notebook says of XLA:CPU: it widens bfloat16 all-reduces to float32, and
    converts around every bfloat16 operation."""
    f32, mixed = (lenet_steps[k].compile().as_text() for k in ("float32", "mixed"))
    assert d2l.allreduce_bytes(mixed) == d2l.allreduce_bytes(f32)
    assert mixed.count(" convert(") > 2 * f32.count(" convert(")


def test_partitioned_hlo_of_a_one_device_program_is_its_hlo():
    lowered = jax.jit(lambda x: x * 2).lower(jnp.ones(3))
    assert "multiply" in d2l.partitioned_hlo(lowered)


def test_allreduce_bytes_reads_sync_async_and_tuple_all_reduces():
    hlo = """
  %a = bf16[20,9]{1,0} all-reduce(%x), channel_id=1, to_apply=%add
  %b = (f32[], f32[10]{0}) all-reduce(%l, %g), channel_id=2, to_apply=%add
  %c = f32[4,4]{1,0} all-reduce-start(%z), channel_id=3, to_apply=%add
  %d = f32[4,4]{1,0} all-reduce-done(%c)
  %e = f32[8]{0} all-gather(%q), dimensions={0}
"""
    assert d2l.allreduce_bytes(hlo) == {"bf16": 2 * 180, "f32": 4 + 40 + 64}


class Synthetic:
    """A data module like d2l.FashionMNIST: ten noisy class prototypes, 28x28 images."""

    def __init__(self, num_train, num_val, batch_size, noise=1.5, seed=0):
        rng = np.random.default_rng(seed)
        prototypes = rng.normal(size=(10, 28, 28, 1)).astype(np.float32)

        def draw(n):
            y = rng.integers(0, 10, n).astype(np.int32)
            X = prototypes[y] + noise * rng.normal(size=(n, 28, 28, 1)).astype(np.float32)
            return X, y

        self.batch_size, self.train, self.val = batch_size, draw(num_train), draw(num_val)

    def get_dataloader(self, train, drop_last=False):
        X, y = self.train if train else self.val
        stop = len(y) - len(y) % self.batch_size if drop_last else len(y)
        return [(X[i:i + self.batch_size], y[i:i + self.batch_size])
                for i in range(0, stop, self.batch_size)]


def test_mixed_precision_accuracy_is_within_the_stated_tolerance(mesh):
    """The notebook's tolerance: three standard errors of an accuracy measured on n test
    examples, 3 * sqrt(1 / (4 n)); deterministic (fixed data, fixed initial parameters)."""
    params = d2l.init_lenet_params(jax.random.key(0))
    adam = optax.adam(1e-3)
    data = Synthetic(num_train=1024, num_val=512, batch_size=128)
    accuracy = {}
    for name, make in (("float32", d2l.make_train_step),
                       ("mixed", d2l.make_mixed_precision_step)):
        trained, accuracy[name] = d2l.train_sharded(make(adam, d2l.mixed_loss_fn), params,
                                                    adam, data, mesh, num_epochs=2)
        assert all(p.dtype == jnp.float32 for p in trained)   # float32 master weights
    tolerance = 3 * math.sqrt(1 / (4 * 512))
    assert accuracy["float32"][-1] > 0.5                      # it learned something
    assert abs(accuracy["mixed"][-1] - accuracy["float32"][-1]) <= tolerance, accuracy


def test_bfloat16_weights_lose_updates_that_float32_master_weights_keep():
    # the counter: a bfloat16 1 + 1e-3 rounds back to 1; float32 keeps it; 0 is no update
    params, updates = [jnp.ones(3)], [jnp.array([1e-3, 1e-2, 0.0])]
    assert d2l.lost_updates(params, updates, jnp.bfloat16) == (1, 3)
    assert d2l.lost_updates(params, updates, jnp.float32) == (0, 3)

    # one SGD step whose update is -1e-3 on every weight (gradient 1e-3, learning rate 1)
    loss = lambda p, X, y: 1e-3 * jnp.sum(p[0].astype(jnp.float32))
    sgd = optax.sgd(1.0)
    master = [jnp.ones(4)]
    mixed, _, _ = d2l.make_mixed_precision_step(sgd, loss)(master, sgd.init(master), 0, 0)
    pure = [jnp.ones(4, jnp.bfloat16)]
    pure, _, _ = d2l.make_train_step(sgd, loss)(pure, sgd.init(pure), 0, 0)
    # the gradient is a bfloat16 number: 1e-3 to within 2^-9 of it, hence atol 1e-5
    assert mixed[0].dtype == jnp.float32 and np.allclose(mixed[0], 1 - 1e-3, atol=1e-5)
    assert pure[0].dtype == jnp.bfloat16 and bool((pure[0] == 1).all())   # all lost


def test_transformer_computes_in_its_dtype_with_float32_parameters(mesh):
    corpus = d2l.CharCorpus(batch_size=8, seq_len=16)
    shape, rules = d2l.sharding_rules("dp")
    lm_mesh = d2l.device_mesh(shape)
    model = d2l.create_sharded(lambda: d2l.TransformerLM(
        corpus.vocab_size, corpus.seq_len, d_model=32, num_heads=4, num_layers=1,
        dtype=jnp.bfloat16, rngs=nnx.Rngs(0)), lm_mesh, rules)
    graphdef, params = nnx.split(model)
    assert {p.dtype for p in jax.tree.leaves(params)} == {jnp.dtype(jnp.float32)}
    X, Y = corpus.batch(0)
    logits = jax.eval_shape(lambda p: nnx.merge(graphdef, p)(X), params)
    loss_value = jax.eval_shape(lambda p: d2l.lm_loss(nnx.merge(graphdef, p), X, Y), params)
    assert (logits.dtype, loss_value.dtype) == (jnp.bfloat16, jnp.float32)
    loss = lambda p, X, Y: d2l.lm_loss(nnx.merge(graphdef, p), X, Y)
    adam = optax.adam(1e-3)
    step = d2l.make_train_step(adam, loss)
    args = (params, d2l.shard(adam.init(params), lm_mesh),
            *d2l.shard_batch(X, Y, lm_mesh))
    sent = d2l.allreduce_bytes(d2l.partitioned_hlo(step.lower(*args)))
    norms = sum(p.size for path, p in jax.tree.leaves_with_path(params)
                if "norm" in jax.tree_util.keystr(path))
    n = sum(p.size for p in jax.tree.leaves(params))
    assert sent == {"bf16": 2 * (n - norms), "f32": 4 * norms + 4}  # LayerNorms: float32


@pytest.mark.parametrize("call, error, message", [
    (lambda: d2l.make_mixed_precision_step(None, d2l.mixed_loss_fn), TypeError,
     "optimizer must be an optax optimizer"),
    (lambda: d2l.make_mixed_precision_step(optax.sgd(0.1), "loss"), TypeError,
     "loss must be a function"),
    (lambda: d2l.make_mixed_precision_step(optax.sgd(0.1), d2l.mixed_loss_fn, jnp.int32),
     ValueError, "compute_dtype must be a floating-point type"),
    (lambda: d2l.make_mixed_precision_step(optax.sgd(0.1), d2l.mixed_loss_fn, "fp8"),
     ValueError, "compute_dtype must be a floating-point type"),
    (lambda: d2l.allreduce_bytes(jax.jit(lambda x: x).lower(1.0)), TypeError,
     "allreduce_bytes reads HLO text"),
    (lambda: d2l.partitioned_hlo("HloModule m"), TypeError, "pass jax.jit"),
    (lambda: d2l.lost_updates([jnp.ones(2)], [jnp.ones(2), jnp.ones(2)], jnp.bfloat16),
     ValueError, "structure of params"),
    (lambda: d2l.lost_updates([jnp.ones(2)], [jnp.ones(2)], jnp.int8), ValueError,
     "dtype must be a floating-point type"),
    (lambda: d2l.train_sharded(None, [], optax.sgd(0.1), Synthetic(16, 16, 8),
                               d2l.device_mesh(), 0), ValueError,
     "num_epochs must be a positive integer"),
    (lambda: d2l.train_sharded(None, [], optax.sgd(0.1), Synthetic(16, 12, 8),
                               d2l.device_mesh(), 1), ValueError,
     "the last test batch: size 4 does not divide evenly over 8 devices"),
])
def test_bad_input_is_refused_with_the_fix(call, error, message):
    with pytest.raises(error, match=message):
        call()
