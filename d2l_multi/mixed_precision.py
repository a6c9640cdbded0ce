"""Mixed precision: float32 master parameters and optimizer state, the forward
and backward passes (and so the gradient allreduce) in bfloat16, and the bytes
that the all-reduces of an HLO program move, read from its text (``d2l.collective_ops``)."""
import glob
import math
import pathlib
import tempfile
import uuid
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.flatten_util import ravel_pytree
from jax.sharding import Mesh
from jax.typing import ArrayLike, DTypeLike

from . import _checks as check
from ._earlier import mixed_precision as d2l
from .concise import shard, shard_batch
from .errors import InputError
from .models import Params, check_batch, num_correct
from .utils import Accumulator


def lost_updates(params, updates, dtype):
    """How many nonzero ``updates`` leave ``params`` unchanged when both are
    stored in ``dtype``, and how many entries there are."""
    p = ravel_pytree(params)[0].astype(dtype)   # all entries in one vector
    u = ravel_pytree(updates)[0].astype(dtype)
    return int(jnp.sum((p + u == p) & (u != 0))), u.size


def make_mixed_precision_step(optimizer, loss, compute_dtype=jnp.bfloat16):
    """``d2l.make_train_step`` that runs ``loss`` and its gradient on a
    ``compute_dtype`` copy of the float32 master parameters."""
    @jax.jit
    def train_step(params, opt_state, X, y):
        copy = optax.tree.cast(params, compute_dtype)  # the compute copy
        loss_value, grads = jax.value_and_grad(loss)(copy, X, y)  # 16-bit
        grads = optax.tree.cast(grads, jnp.float32)  # for a float32 update
        updates, opt_state = optimizer.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss_value
    return train_step


def mixed_loss_fn(params, X, y):
    """LeNet's loss in its parameters' dtype, the cross-entropy in float32."""
    logits = d2l.lenet(params, X.astype(params[0].dtype))
    return optax.softmax_cross_entropy_with_integer_labels(
        logits.astype(jnp.float32), y).mean()


def allreduce_bytes(hlo_text):
    """Bytes that the all-reduces of an HLO program reduce, by element type."""
    total = {}
    for op in d2l.collective_ops(hlo_text):  # each once, in any form
        if op.kind == "all-reduce":
            for dtype, shape in op.arrays:
                size = math.prod(shape) * d2l.HLO_BYTES[dtype]
                total[dtype] = total.get(dtype, 0) + size
    return total


def train_sharded(train_step, params, optimizer, data, mesh, num_epochs):
    """Train data parallel on ``mesh``; return the parameters and the test
    accuracy of their float32 values after each epoch."""
    params = shard(params, mesh)
    opt_state = shard(optimizer.init(params), mesh)
    train_iter = data.get_dataloader(train=True, drop_last=True)
    accuracies = []
    for epoch in range(num_epochs):
        for X, y in train_iter:
            params, opt_state, _ = train_step(
                params, opt_state, *shard_batch(X, y, mesh))
        correct = Accumulator(2)  # correct predictions, examples
        params32 = optax.tree.cast(params, jnp.float32)
        for X, y in data.get_dataloader(train=False):
            Xs, ys = shard_batch(X, y, mesh)
            correct.add(num_correct(params32, Xs, ys), len(y))
        accuracies.append(correct[0] / correct[1])
    return params, accuracies


def partitioned_hlo(lowered: jax.stages.Lowered) -> str:
    """The HLO text of ``lowered`` (``jax.jit(f).lower(...)``) right after
    XLA's SPMD partitioner: the collectives the program asks for, before a
    backend adapts them.

    XLA writes it when asked to (``xla_dump_to``, ``xla_dump_hlo_pass_re``).
    The name of a pass that does not exist, in ``xla_disable_hlo_passes``,
    keeps JAX's persistent compilation cache from answering in the compiler's
    place: the dump options are not part of the cache's key."""
    if not isinstance(lowered, jax.stages.Lowered):
        raise InputError(f"partitioned_hlo reads a lowered program, not a "
                         f"{type(lowered).__name__}; pass "
                         f"jax.jit(f).lower(*args)")
    with tempfile.TemporaryDirectory(prefix="d2l_hlo_") as folder:
        lowered.compile(compiler_options={
            "xla_dump_to": folder,
            "xla_dump_hlo_pass_re": "spmd-partitioning",
            "xla_disable_hlo_passes": f"no-such-pass-{uuid.uuid4().hex}"})
        files = sorted(glob.glob(f"{folder}/*after_spmd-partitioning*.txt"))
        if not files:  # a program for one device: nothing was partitioned
            return lowered.as_text(dialect="hlo")
        return pathlib.Path(files[-1]).read_text()


def _check_allreduce_bytes(hlo_text: str) -> None:
    """Raise a TypeError unless ``hlo_text`` is HLO text (a string)."""
    if not isinstance(hlo_text, str):
        raise InputError(f"allreduce_bytes reads HLO text, not a "
                         f"{type(hlo_text).__name__}; pass "
                         f"f.lower(*args).compile().as_text()")


def _check_lost_updates(params: Any, updates: Any, dtype: DTypeLike) -> None:
    """Refuse updates shaped unlike the parameters, or a dtype that is not a
    floating-point type."""
    check.tree(params)
    if jax.tree.structure(params) != jax.tree.structure(updates):
        raise InputError("updates must have the structure of params (one "
                         "update per parameter array)")
    _check_float_dtype(dtype, "dtype")


def _check_float_dtype(dtype, name="compute_dtype"):
    """Raise a ValueError unless ``dtype`` is a floating-point type."""
    try:
        floating = jnp.issubdtype(np.dtype(dtype), jnp.floating)
    except TypeError:
        floating = False
    if not floating:
        raise InputError(f"{name} must be a floating-point type such as "
                         f"jnp.bfloat16, got {dtype!r}")


def _check_mixed_step(optimizer: optax.GradientTransformation, loss: Callable[..., jax.Array],
                      compute_dtype: DTypeLike = jnp.bfloat16) -> None:
    """Refuse a step without an optax optimizer, a loss function or a
    floating-point compute dtype."""
    check.optimizer(optimizer)
    if not callable(loss):
        raise InputError(f"loss must be a function loss(params, X, y), got "
                         f"{loss!r}")
    _check_float_dtype(compute_dtype)


def _check_train_sharded(train_step: Callable[..., Any], params: Params,
                         optimizer: optax.GradientTransformation, data: Any, mesh: Mesh,
                         num_epochs: int) -> None:
    """Refuse a non-positive epoch count, or batches (training or test) that
    do not split evenly over the devices of ``mesh``."""
    check.positive(num_epochs=num_epochs)
    check.optimizer(optimizer)
    check.mesh(mesh)
    check.divisible(data.batch_size, mesh.size)
    last = len(data.val[1]) % data.batch_size  # a smaller last test batch
    check.divisible(last or data.batch_size, mesh.size,
                    "the last test batch: size")


def _check_mixed_loss(params: Params, X: ArrayLike, y: ArrayLike) -> None:
    check_batch(params, X, y)


lost_updates = check.validated(lost_updates, _check_lost_updates)
mixed_loss_fn = check.validated(mixed_loss_fn, _check_mixed_loss)
make_mixed_precision_step = check.validated(make_mixed_precision_step,
                                            _check_mixed_step)
allreduce_bytes = check.validated(allreduce_bytes, _check_allreduce_bytes)
train_sharded = check.validated(train_sharded, _check_train_sharded)
