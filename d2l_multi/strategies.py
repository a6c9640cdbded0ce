"""Parallelism strategies as sharding rules: data parallelism, fully-sharded data parallelism
(FSDP), tensor parallelism (TP) and their mixes differ only in the rules that map the logical
axes of ``TransformerLM`` to a 2-D ``('data', 'model')`` mesh; one training step for all of
them."""
import jax
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec as P

import d2l_multi as d2l

LOGICAL_AXES = ("batch", "embed", "heads", "mlp", "vocab")  # the names TransformerLM uses

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
    """The mesh shape and the complete rules (None = replicated) of one of ``STRATEGIES``."""
    if strategy not in STRATEGIES:
        raise ValueError(f"unknown strategy {strategy!r}; use one of {list(STRATEGIES)}")
    shape, rules = STRATEGIES[strategy]
    return shape, {axis: rules.get(axis) for axis in LOGICAL_AXES}


def reshard(model, mesh, rules):
    """A copy of ``model`` (or an nnx.Optimizer) laid out on ``mesh`` by ``rules``, same values."""
    d2l.check_rules(rules, mesh)
    graphdef, state = nnx.split(model)
    with d2l.use_sharding(mesh, rules):
        d2l.check_layout(state, rules, mesh)
        shardings = nnx.get_named_sharding(state, mesh)
    return nnx.merge(graphdef, jax.device_put(state, shardings))


def shard_tokens(X, Y, mesh, rules):
    """Lay a batch of token ids out as the rules say for the logical axis 'batch'."""
    spec = P(rules.get("batch"))
    d2l.check_spec(spec, mesh, np.shape(X))
    return jax.device_put((X, Y), NamedSharding(mesh, spec))


@nnx.jit
def lm_train_step(model, optimizer, X, Y):
    """One optimizer step on (X, Y); the layouts of its inputs decide how it is parallelised."""
    loss, grads = nnx.value_and_grad(d2l.lm_loss)(model, X, Y)
    optimizer.update(model, grads)
    if not jax.sharding.get_abstract_mesh().empty:  # keep the layouts the state came in with;
        state = nnx.state((model, optimizer))      # with Auto axes XLA may pick others
        nnx.update((model, optimizer),
                   jax.lax.with_sharding_constraint(state, nnx.get_partition_spec(state)))
    return loss

