"""Sharded matrix products (notebook 09): the bytes a device sends for each collective, and
run_sharded's program, result and refusals."""
import jax
import jax.numpy as jnp
import pytest
from jax import lax
from jax.sharding import AxisType
from jax.sharding import PartitionSpec as P

import d2l_multi as d2l


def op(kind, shape, k):
    return d2l.CollectiveOp(kind=kind, name="c", asynchronous=False,
                            arrays=(("bf16", shape),), group_size=k)


def test_ring_bytes_of_each_collective():
    n = 2 * 64 * 32  # bytes of a bf16[64, 32]
    assert d2l.ring_bytes(op("all-reduce", (64, 32), 8)) == 2 * 7 / 8 * n
    assert d2l.ring_bytes(op("all-gather", (64, 32), 8)) == 7 / 8 * n
    assert d2l.ring_bytes(op("reduce-scatter", (8, 32), 8)) == 7 / 8 * n  # n: its input
    assert d2l.ring_bytes(op("all-to-all", (64, 32), 4)) == 3 / 4 * n
    assert d2l.ring_bytes(op("collective-permute", (64, 32), 8)) == n
    assert d2l.ring_bytes(op("all-reduce", (64, 32), 1)) == 0


def test_ring_bytes_refuses_what_is_not_a_collective():
    with pytest.raises(TypeError, match="collective_ops"):
        d2l.ring_bytes({"kind": "all-reduce"})


@pytest.fixture(scope="module")
def mesh():
    return jax.make_mesh((8,), ("x",), axis_types=(AxisType.Explicit,))


def test_run_sharded_returns_the_product_and_its_program(mesh):
    X, W = jnp.arange(64.0).reshape(8, 8), jnp.eye(8)
    out, compiled = d2l.run_sharded(lambda x, w: lax.psum(x @ w, "x"), mesh,
                                    (P(None, "x"), P("x")), P(), X, W)
    assert (out == X).all()
    assert [o.kind for o in d2l.collective_ops(compiled.as_text())] == ["all-reduce"]


def test_run_sharded_refuses_a_spec_per_array_missing(mesh):
    with pytest.raises(ValueError, match="in_specs"):
        d2l.run_sharded(lambda x: x, mesh, (P(), P()), P(), jnp.ones(8))


def test_run_sharded_refuses_an_axis_the_mesh_lacks(mesh):
    with pytest.raises(ValueError, match="'y'"):
        d2l.run_sharded(lambda x: x, mesh, (P("y"),), P(), jnp.ones(8))
