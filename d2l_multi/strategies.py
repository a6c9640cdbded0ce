"""Parallelism strategies as sharding rules: data parallelism, fully-sharded
data parallelism (FSDP), tensor parallelism (TP) and their mixes differ only in
the rules that map the logical axes of ``TransformerLM`` to a 2-D
``('data', 'model')`` mesh of 8 devices; one training step for all of them.

The shown functions carry no argument checks; their public names check first
(``check.validated``), so bad input gets a message naming the fix."""
import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P
from jax.typing import ArrayLike

from . import _checks as check
from ._earlier import strategies as d2l
from .errors import InputError
from .sharding import Rules, _check_layout, _check_mesh_rules
from .transformer import _check_tokens_batch

LOGICAL_AXES = ("batch", "embed", "heads", "mlp", "vocab")  # TransformerLM's

STRATEGIES = {  # name: (mesh shape over ('data', 'model'), rules: logical
                #        axis -> mesh axis; the axes not named are replicated)
    "dp": ((8, 1), {"batch": "data"}),
    "fsdp": ((8, 1), {"batch": "data", "embed": "data"}),
    "tp": ((1, 8), {"heads": "model", "mlp": "model", "vocab": "model"}),
    "dp+tp": ((2, 4), {"batch": "data",
                       "heads": "model", "mlp": "model", "vocab": "model"}),
    "fsdp+tp": ((2, 4), {"batch": "data", "embed": "data",
                         "heads": "model", "mlp": "model", "vocab": "model"}),
}


def sharding_rules(strategy):
    """The mesh shape and the complete rules (None = replicated) of one of
    ``STRATEGIES``."""
    shape, rules = STRATEGIES[strategy]
    return shape, {axis: rules.get(axis) for axis in LOGICAL_AXES}


def reshard(model, mesh, rules):
    """A copy of ``model`` (or an nnx.Optimizer) laid out on ``mesh`` by
    ``rules``, with the same values."""
    graphdef, state = nnx.split(model)
    with d2l.use_sharding(mesh, rules):
        shardings = nnx.get_named_sharding(state, mesh)
    return nnx.merge(graphdef, jax.device_put(state, shardings))


def shard_tokens(X, Y, mesh, rules):
    """Lay a batch of token ids out as the rules say for the logical axis
    'batch'."""
    return jax.device_put((X, Y), NamedSharding(mesh, P(rules.get("batch"))))


@nnx.jit
def lm_train_step(model, optimizer, X, Y):
    """One optimizer step on (X, Y); the layouts of its inputs decide how it is
    parallelised."""
    loss, grads = nnx.value_and_grad(d2l.lm_loss)(model, X, Y)
    optimizer.update(model, grads)
    if not jax.sharding.get_abstract_mesh().empty:
        # keep the layouts the state came in with: with Auto axes XLA may
        # pick others, and a layout that drifts means recompiling
        state = nnx.state((model, optimizer))
        nnx.update((model, optimizer), jax.lax.with_sharding_constraint(
            state, nnx.get_partition_spec(state)))
    return loss


# ----- the checks behind the public names -----

def _check_strategy(strategy: str) -> None:
    if strategy not in STRATEGIES:
        raise InputError(f"unknown strategy {strategy!r}; use one of "
                         f"{list(STRATEGIES)}")


def _check_reshard(model: nnx.Module, mesh: Mesh, rules: Rules) -> None:
    _check_mesh_rules(mesh, rules)
    _check_layout(nnx.state(model), rules, mesh)


def _check_tokens(X: ArrayLike, Y: ArrayLike, mesh: Mesh, rules: Rules) -> None:
    _check_mesh_rules(mesh, rules)
    check.examples(X, Y, ("X", "Y"))
    check.spec(P(rules.get("batch")), mesh, np.shape(X))


def _check_lm_step(model: nnx.Module, optimizer: nnx.Optimizer, X: ArrayLike,
                   Y: ArrayLike) -> None:
    _check_tokens_batch(model, X, Y)


sharding_rules = check.validated(sharding_rules, _check_strategy)
reshard = check.validated(reshard, _check_reshard)
shard_tokens = check.validated(shard_tokens, _check_tokens)
lm_train_step = check.validated(lm_train_step, _check_lm_step)
