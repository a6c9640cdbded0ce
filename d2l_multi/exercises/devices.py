"""The checks of the exercises of notebook 00_devices."""
import math

import numpy as np

from ._common import _call, _exercise, _fail, _mesh, _observe

# --------------------------------------------------------------------------------------------
# 00: devices and shardings


@_exercise("00_devices", cases=[((2, 4), (6, 8))],
           passed="rows over 'x', columns over 'y': each device holds its block")
def mesh_layout(place, case):
    """``place(x, mesh)`` lays a 2-D array out with rows split over mesh axis 'x' and columns
    over 'y'."""
    mesh_shape, shape = case
    x = np.arange(math.prod(shape), dtype=np.float32).reshape(shape)

    def probe():
        import jax
        import jax.numpy as jnp
        mesh = _mesh(mesh_shape, ("x", "y"))
        out = _call(place, "place", jnp.asarray(x), mesh)
        if not isinstance(out, jax.Array):
            return {"type": type(out).__name__}
        where = out.sharding.devices_indices_map(shape)
        if any(d not in where for d in mesh.devices.flat):
            return {"values": np.asarray(out), "devices": len(out.sharding.device_set),
                    "device": str(next(iter(out.sharding.device_set))),
                    "shard": tuple(out.sharding.shard_shape(shape)), "starts": None}
        return {"values": np.asarray(out), "devices": len(out.sharding.device_set),
                "device": str(next(iter(out.sharding.device_set))),
                "shard": tuple(out.sharding.shard_shape(shape)),
                "starts": [[(where[mesh.devices[i, j]][0].start or 0,
                             where[mesh.devices[i, j]][1].start or 0)
                            for j in range(mesh_shape[1])] for i in range(mesh_shape[0])]}
    seen = _observe(probe)
    if "type" in seen:
        _fail(f"returned a {seen['type']}: put the array on the devices with "
              f"jax.device_put(x, NamedSharding(mesh, ...))")
    if not np.array_equal(seen["values"], x):
        _fail("the values changed: lay the array out, do not transform it")
    if seen["devices"] == 1:
        _fail(f"your array lives on one device ({seen['device']}): give it a NamedSharding "
              f"over the whole mesh")
    rows, cols = shape[0] // mesh_shape[0], shape[1] // mesh_shape[1]
    got = tuple(seen["shard"])
    if got == tuple(shape):
        _fail(f"every device holds the whole {tuple(shape)} array (replicated): name the mesh "
              f"axis that splits each array axis in the PartitionSpec")
    if got == (rows, shape[1]):
        _fail(f"each shard is {got}: the rows are split but not the columns; split the second "
              f"axis over 'y'")
    if got == (shape[0], cols):
        _fail(f"each shard is {got}: the columns are split but not the rows; split the first "
              f"axis over 'x'")
    if got != (rows, cols):
        _fail(f"each shard is {got}, expected {(rows, cols)} on a {tuple(mesh_shape)} mesh: "
              f"rows over 'x', columns over 'y'")
    if seen["starts"] is None:
        _fail("your array is not on the mesh's devices: give it a NamedSharding over the mesh "
              "you were given")
    for i in range(mesh_shape[0]):
        for j in range(mesh_shape[1]):
            if tuple(seen["starts"][i][j]) != (i * rows, j * cols):
                _fail(f"the device at mesh position ({i}, {j}) holds the wrong block: rows "
                      f"follow mesh axis 'x' and columns axis 'y', in order")
