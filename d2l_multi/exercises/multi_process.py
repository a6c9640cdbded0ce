"""The checks of the exercises of notebook 11a_multi_process."""
import numpy as np

from ._common import _call, _exercise, _fail, _mesh, _observe

# --------------------------------------------------------------------------------------------
# 11a: several processes


def _rows(value, name):
    if isinstance(value, slice):
        value = range(*value.indices(10**9))
    try:
        return [int(i) for i in np.asarray(list(value)).ravel()]
    except Exception:
        _fail(f"`{name}` should return row indices (a range, slice or array), got "
              f"{type(value).__name__}")


def _assemble(batch, rows, num_processes):
    """The global array JAX assembles from each process's rows: process p's devices are the
    p-th group of the mesh (processes in order), each holding its share of p's rows. None
    where the rows cannot be laid out so."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P
    per = max(1, 8 // num_processes)
    mesh = _mesh((num_processes * per,), ("data",))
    devices = list(mesh.devices.flat)
    if any(len(r) * num_processes != len(batch) or len(r) % per for r in rows) or any(
            not 0 <= i < len(batch) for r in rows for i in r):
        return None
    shards = []
    for p, r in enumerate(rows):
        local = batch[r]
        for d, piece in enumerate(np.split(local, per)):
            shards.append(jax.device_put(piece, devices[p * per + d]))
    sharding = NamedSharding(mesh, P("data"))
    return np.asarray(jax.make_array_from_single_device_arrays(batch.shape, sharding, shards))


@_exercise("11a_multi_process", cases=[(256, 2), (96, 4)],
           passed="the global array assembled from the processes' rows is the batch")
def process_rows(process_rows, case):
    """``process_rows(batch_size, num_processes, process_index)``: the rows of a global batch
    this process loads, so that the global array assembled over the mesh (processes in order)
    is the batch."""
    b, n = case
    batch = np.arange(b, dtype=np.int32)

    def probe():
        rows = [_rows(_call(process_rows, "process_rows", b, n, p), "process_rows")
                for p in range(n)]
        return {"rows": rows, "global": _assemble(batch, rows, n)}
    seen = _observe(probe)
    local = b // n
    for p, got in enumerate(seen["rows"]):
        if len(got) != local:
            _fail(f"process {p} of {n} loads {len(got)} rows of a batch of {b}: each loads "
                  f"b / num_processes = {local}")
    if seen["global"] is not None and np.array_equal(seen["global"], batch):
        return
    for p, got in enumerate(seen["rows"]):
        if got == list(range(p, b, n)):
            _fail("every num_processes-th row is interleaved: process p must load one "
                  "contiguous block, because the global array's rows follow the devices in "
                  "mesh order, process 0's first")
        if got and got[0] != p * local and got == list(range(got[0], got[0] + local)):
            _fail(f"off by one block: process {p}'s rows start at row {got[0]}; process 0's "
                  f"start at row 0, and the processes follow each other in order")
    _fail(f"the global array assembled from your rows is not the batch (process 0 loads rows "
          f"{seen['rows'][0][:3]}...)")
