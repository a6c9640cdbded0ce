"""Sharded matrix products (notebook 09): run a per-device program with ``jax.shard_map`` and
read the collectives of its compiled program, and the bytes each device sends for a collective
with the bandwidth-optimal ring algorithms.

The shown functions carry no argument checks; their public names check first
(``check.validated``), so bad input gets a message naming the fix."""
from collections.abc import Callable
from typing import Any

import jax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from . import _checks as check
from .errors import InputError
from .hlo import COLLECTIVES, CollectiveOp


def run_sharded(program, mesh, in_specs, out_specs, *arrays):
    """Run ``program``, the code of one device, with ``jax.shard_map`` on
    ``arrays`` laid out by ``in_specs``; return the result and the compiled
    program."""
    placed = [jax.device_put(a, NamedSharding(mesh, spec))
              for a, spec in zip(arrays, in_specs)]
    f = jax.jit(jax.shard_map(program, mesh=mesh, in_specs=in_specs,
                              out_specs=out_specs))
    compiled = f.lower(*placed).compile()
    return compiled(*placed), compiled


def ring_bytes(op):
    """Bytes each device sends for the collective ``op`` (a
    ``d2l.CollectiveOp``) with the ring algorithms, k = its group size."""
    k, out = op.group_size, op.nbytes  # out: the bytes it returns
    if op.kind == "all-reduce":        # n = out
        return 2 * (k - 1) / k * out
    if op.kind == "reduce-scatter":    # n = k * out
        return (k - 1) * out
    if op.kind in ("all-gather", "all-to-all"):  # n = out
        return (k - 1) / k * out
    return out                         # collective-permute: one send


def _check_run_sharded(program: Callable[..., Any], mesh: Mesh,
                       in_specs: tuple[PartitionSpec, ...], out_specs: Any,
                       *arrays: Any) -> None:
    if not callable(program):
        raise InputError(f"program must be the function one device runs, got {program!r}")
    if len(in_specs) != len(arrays):
        raise InputError(f"in_specs has {len(in_specs)} PartitionSpecs for {len(arrays)} "
                         f"arrays: give one spec per array")
    for spec, a in zip(in_specs, arrays):
        if not isinstance(spec, PartitionSpec):
            raise InputError(f"each of in_specs lays out one argument (an array or a pytree "
                            f"of arrays) and must be one PartitionSpec, got {spec!r}")
        for leaf in jax.tree.leaves(a):
            check.spec(spec, mesh, jax.numpy.shape(leaf))


def _check_ring_bytes(op: CollectiveOp) -> None:
    if not isinstance(op, CollectiveOp) or op.kind not in COLLECTIVES:
        raise InputError(f"ring_bytes reads one collective of d2l.collective_ops(hlo_text), "
                        f"got {op!r}")


run_sharded = check.validated(run_sharded, _check_run_sharded)
ring_bytes = check.validated(ring_bytes, _check_ring_bytes)
