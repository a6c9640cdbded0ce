"""The checks of the exercises of notebook 09c_fsdp_and_tensor_parallelism."""
import math

import numpy as np

from ._common import _close, _exercise, _fail, _mesh, _observe, _value

# --------------------------------------------------------------------------------------------
# 09c: FSDP and tensor parallelism


def _entries(spec, name):
    """A PartitionSpec as plain data: a tuple of None, names and tuples of names."""
    from jax.sharding import PartitionSpec
    spec = _value(spec, "PartitionSpec")
    if spec is None:
        spec = PartitionSpec()
    if not isinstance(spec, PartitionSpec):
        _fail(f"`{name}` should be a jax.sharding.PartitionSpec, e.g. P(None, 'data'); got "
              f"{type(spec).__name__}")
    return tuple(tuple(str(n) for n in e) if isinstance(e, (tuple, list)) else
                 (None if e is None else str(e)) for e in spec)


def _spec_axes(entries):
    names = []
    for entry in entries:
        names += list(entry) if isinstance(entry, tuple) else ([entry] if entry else [])
    return names


def _shown(entries):
    return "P(" + ", ".join(repr(e) for e in entries) + ")"


def _forward(mesh, specs, shapes, program, seed):
    """Run ``program`` on random arrays of ``shapes``, the last ones laid out by ``specs``."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding, PartitionSpec
    rng = np.random.default_rng(seed)
    arrays = [jnp.asarray(rng.normal(size=s), jnp.float32) for s in shapes]
    placed = arrays[:1] + [jax.device_put(a, NamedSharding(mesh, PartitionSpec(*s)))
                           for a, s in zip(arrays[1:], specs)]
    return np.asarray(jax.jit(program)(*placed), np.float64)


def _mlp(x, a, b):
    import jax
    return jax.nn.gelu(x @ a) @ b


@_exercise("09c_fsdp_and_tensor_parallelism", cases=["layout"],
           passed="each device holds 1/8 of the kernel")
def fsdp_spec(spec, case):
    """``spec``: the PartitionSpec that gives FSDP to a Dense kernel of shape (512, 2048) on a
    mesh with one axis, 'data', of 8 devices."""
    def probe():
        entries = _entries(spec, "spec")
        names = _spec_axes(entries)
        seen = {"spec": entries}
        if len(entries) <= 2 and set(names) <= {"data"} and len(names) == len(set(names)):
            from jax.sharding import NamedSharding, PartitionSpec
            mesh = _mesh((8,), ("data",))
            seen["shard"] = tuple(NamedSharding(mesh, PartitionSpec(*entries)).shard_shape(
                (512, 2048)))
            if case == "forward":
                seen["forward"] = _forward(mesh, [entries], [(16, 512), (512, 2048)],
                                           lambda x, w: x @ w, 0)
        return seen
    seen = _observe(probe)
    entries = seen["spec"]
    names, shown = _spec_axes(entries), _shown(entries)
    if len(entries) > 2:
        _fail(f"{shown} has {len(entries)} entries for a 2-D kernel")
    if len(names) != len(set(names)):
        _fail(f"{shown} names a mesh axis twice: each mesh axis splits at most one array axis")
    if [n for n in names if n != "data"]:
        _fail(f"{shown} names {[n for n in names if n != 'data']}: this mesh has one axis, "
              f"'data'")
    if not names:
        _fail("every device holds the whole kernel: that is data parallelism; FSDP splits "
              "each parameter over 'data' (and gathers it just before use)")
    if math.prod(seen["shard"]) * 8 != 512 * 2048:
        _fail(f"each device holds a {seen['shard']} block, not 1/8 of the kernel")
    if case == "forward":
        rng = np.random.default_rng(0)
        x, w = rng.normal(size=(16, 512)), rng.normal(size=(512, 2048))
        want = np.asarray(x, np.float32).astype(np.float64) @ np.asarray(w, np.float32)
        if not _close(seen["forward"], want, rtol=1e-4, atol=1e-3):
            _fail("a forward pass with your layout differs from the unsharded one")


@_exercise("09c_fsdp_and_tensor_parallelism", cases=["layout"],
           passed="W1 split by columns, W2 by rows: one all-reduce after W2")
def megatron_specs(specs, case):
    """``specs = (w1_spec, w2_spec)``: PartitionSpecs of the MLP y = gelu(x @ W1) @ W2, W1 of
    shape (d, 4d) and W2 of shape (4d, d), for Megatron tensor parallelism over a mesh axis
    'model': one all-reduce per MLP, none between the two layers."""
    def probe():
        pair = _value(specs, "pair of PartitionSpecs")
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            return {"pair": False}
        entries = [_entries(s, n) for s, n in zip(pair, ("w1_spec", "w2_spec"))]
        seen = {"pair": True, "specs": tuple(entries)}
        if case == "forward" and all(set(_spec_axes(e)) <= {"model"} and len(e) <= 2
                                     for e in entries):
            seen["forward"] = _forward(_mesh((8,), ("model",)), entries,
                                       [(4, 16), (16, 64), (64, 16)], _mlp, 3)
        return seen
    seen = _observe(probe)
    if not seen["pair"]:
        _fail("give two PartitionSpecs, (w1_spec, w2_spec)")
    w1, w2 = seen["specs"]
    for s, n in ((w1, "w1_spec"), (w2, "w2_spec")):
        if [a for a in _spec_axes(s) if a != "model"]:
            _fail(f"{n} = {_shown(s)}: this mesh has one axis, 'model'")
        if len(s) > 2:
            _fail(f"{n} = {_shown(s)} has {len(s)} entries for a 2-D weight")

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
        _fail("W1 split along its input features gives each device a partial sum of the hidden "
              "layer before the nonlinearity (gelu(a + b) != gelu(a) + gelu(b)): split W1's "
              "columns, its output features")
    if split(w2, 1):
        _fail("W2 split along its output features needs the whole hidden activation on every "
              "device, an all-gather between the layers: split W2's rows, its input features, "
              "so each device uses its own hidden units")
    if case == "forward":
        import jax.numpy as jnp
        rng = np.random.default_rng(3)
        x, a, b = (jnp.asarray(rng.normal(size=s), jnp.float32)
                   for s in [(4, 16), (16, 64), (64, 16)])
        if not _close(seen["forward"], np.asarray(_mlp(x, a, b)), rtol=1e-3, atol=1e-3):
            _fail("the MLP with your layout differs from the unsharded one")
