"""The checks of the exercises of notebook 09c_fsdp_and_tensor_parallelism."""
import math

import numpy as np

from ._common import _close, _exercise, _fail, _mesh, _value

# --------------------------------------------------------------------------------------------
# 09c: FSDP and tensor parallelism

def _as_spec(spec, name):
    from jax.sharding import PartitionSpec
    spec = _value(spec, "PartitionSpec")
    if spec is None:
        spec = PartitionSpec()
    if not isinstance(spec, PartitionSpec):
        _fail(f"`{name}` should be a jax.sharding.PartitionSpec, e.g. P(None, 'data'); got "
              f"{type(spec).__name__}")
    return spec


def _spec_axes(spec):
    names = []
    for entry in spec:
        names += list(entry) if isinstance(entry, (tuple, list)) else (
            [entry] if entry is not None else [])
    return names


@_exercise("09c_fsdp_and_tensor_parallelism")
def fsdp_spec(spec, hidden=False):
    """``spec``: the PartitionSpec that gives FSDP to a Dense kernel of shape (512, 2048) on a
    mesh with one axis, 'data', of 8 devices."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    spec = _as_spec(spec, "spec")
    names = _spec_axes(spec)
    if len(spec) > 2:
        _fail(f"{spec} has {len(spec)} entries for a 2-D kernel")
    if len(names) != len(set(names)):
        _fail(f"{spec} names a mesh axis twice: each mesh axis splits at most one array axis")
    if [n for n in names if n != "data"]:
        _fail(f"{spec} names {[n for n in names if n != 'data']}: this mesh has one axis, "
              f"'data'")
    if not names:
        _fail("every device holds the whole kernel: that is data parallelism; FSDP splits "
              "each parameter over 'data' (and gathers it just before use)")
    mesh = _mesh((8,), ("data",))
    shard = NamedSharding(mesh, spec).shard_shape((512, 2048))
    if math.prod(shard) * 8 != 512 * 2048:
        _fail(f"each device holds a {shard} block, not 1/8 of the kernel")
    if hidden:
        w = jnp.asarray(np.random.default_rng(0).normal(size=(512, 2048)), jnp.float32)
        x = jnp.ones((16, 512), jnp.float32)
        placed = jax.device_put(w, NamedSharding(mesh, spec))
        if not _close(jax.jit(jnp.matmul)(x, placed), x @ w, rtol=1e-4, atol=1e-3):
            _fail("a forward pass with your layout differs from the unsharded one")
    return f"{spec}: each device holds 1/8 of the kernel, {shard}"


@_exercise("09c_fsdp_and_tensor_parallelism")
def megatron_specs(specs, hidden=False):
    """``specs = (w1_spec, w2_spec)``: PartitionSpecs of the MLP y = gelu(x @ W1) @ W2, W1 of
    shape (d, 4d) and W2 of shape (4d, d), for Megatron tensor parallelism over a mesh axis
    'model': one all-reduce per MLP, none between the two layers."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    specs = _value(specs, "pair of PartitionSpecs")
    if not isinstance(specs, (tuple, list)) or len(specs) != 2:
        _fail("give two PartitionSpecs, (w1_spec, w2_spec)")
    w1, w2 = (_as_spec(s, n) for s, n in zip(specs, ("w1_spec", "w2_spec")))
    for s, n in ((w1, "w1_spec"), (w2, "w2_spec")):
        if [a for a in _spec_axes(s) if a != "model"]:
            _fail(f"{n} = {s}: this mesh has one axis, 'model'")
        if len(s) > 2:
            _fail(f"{n} = {s} has {len(s)} entries for a 2-D weight")

    def split(s, axis):
        return len(s) > axis and s[axis] is not None
    if not any(split(w1, a) for a in (0, 1)) or not any(split(w2, a) for a in (0, 1)):
        which = "W1" if not any(split(w1, a) for a in (0, 1)) else "W2"
        _fail(f"{which} is replicated: tensor parallelism splits both weights over 'model'")
    if split(w1, 0) and split(w2, 1):
        _fail("both splits are the wrong way round: W1 split along its input features gives "
              "each device a partial sum of the hidden layer before the nonlinearity, and "
              "gelu(a + b) != gelu(a) + gelu(b)")
    if split(w1, 0):
        _fail("W1 split along its input features gives each device a partial sum of the "
              "hidden layer before the nonlinearity (gelu(a + b) != gelu(a) + gelu(b)): split "
              "W1's columns, its output features")
    if split(w2, 1):
        _fail("W2 split along its output features needs the whole hidden activation on every "
              "device, an all-gather between the layers: split W2's rows, its input features, "
              "so each device uses its own hidden units")
    if hidden:
        mesh = _mesh((8,), ("model",))
        rng = np.random.default_rng(3)
        x = jnp.asarray(rng.normal(size=(4, 16)), jnp.float32)
        a = jnp.asarray(rng.normal(size=(16, 64)), jnp.float32)
        b = jnp.asarray(rng.normal(size=(64, 16)), jnp.float32)
        mlp = jax.jit(lambda x, a, b: jax.nn.gelu(x @ a) @ b)
        got = mlp(x, jax.device_put(a, NamedSharding(mesh, w1)),
                  jax.device_put(b, NamedSharding(mesh, w2)))
        if not _close(got, mlp(x, a, b), rtol=1e-3, atol=1e-3):
            _fail("the MLP with your layout differs from the unsharded one")
    return "W1 split by columns, W2 by rows: one all-reduce after W2"
