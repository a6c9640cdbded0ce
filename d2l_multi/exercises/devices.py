"""The checks of the exercises of notebook 00_devices."""
import math

import numpy as np

from ._common import _call, _exercise, _fail, _mesh

# --------------------------------------------------------------------------------------------
# 00: devices and shardings

@_exercise("00_devices")
def mesh_layout(place, hidden=False):
    """``place(x, mesh)`` lays a 2-D array out with rows split over mesh axis 'x' and columns
    over 'y'."""
    import jax
    import jax.numpy as jnp
    cases = [((2, 4), (6, 8))] + ([((4, 2), (8, 6)), ((2, 2), (4, 10))] if hidden else [])
    for mesh_shape, shape in cases:
        mesh = _mesh(mesh_shape, ("x", "y"))
        x = jnp.arange(math.prod(shape), dtype=jnp.float32).reshape(shape)
        out = _call(place, "place", x, mesh)
        if not isinstance(out, jax.Array):
            _fail(f"returned a {type(out).__name__}: put the array on the devices with "
                  f"jax.device_put(x, NamedSharding(mesh, ...))")
        if not np.array_equal(np.asarray(out), np.asarray(x)):
            _fail("the values changed: lay the array out, do not transform it")
        devices = out.sharding.device_set
        if len(devices) == 1:
            _fail(f"your array lives on one device ({next(iter(devices))}): give it a "
                  f"NamedSharding over the whole mesh")
        rows, cols = shape[0] // mesh_shape[0], shape[1] // mesh_shape[1]
        got = tuple(out.sharding.shard_shape(shape))
        if got == shape:
            _fail(f"every device holds the whole {shape} array (replicated): name the mesh "
                  f"axis that splits each array axis in the PartitionSpec")
        if got == (rows, shape[1]):
            _fail(f"each shard is {got}: the rows are split but not the columns; split the "
                  f"second axis over 'y'")
        if got == (shape[0], cols):
            _fail(f"each shard is {got}: the columns are split but not the rows; split the "
                  f"first axis over 'x'")
        if got != (rows, cols):
            _fail(f"each shard is {got}, expected {(rows, cols)} on a {mesh_shape} mesh: rows "
                  f"over 'x', columns over 'y'")
        for i in range(mesh_shape[0]):
            for j in range(mesh_shape[1]):
                index = out.sharding.devices_indices_map(shape)[mesh.devices[i, j]]
                if (index[0].start or 0) != i * rows or (index[1].start or 0) != j * cols:
                    _fail(f"the device at mesh position ({i}, {j}) holds the wrong block: rows "
                          f"follow mesh axis 'x' and columns axis 'y', in order")
    return "rows over 'x', columns over 'y': each device holds its block"
