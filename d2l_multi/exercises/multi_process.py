"""The checks of the exercises of notebook 11a_multi_process."""
import numpy as np

from ._common import _call, _exercise, _fail

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


@_exercise("11a_multi_process")
def process_rows(process_rows, hidden=False):
    """``process_rows(batch_size, num_processes, process_index)``: the rows of a global batch
    this process loads, so that the global array assembled over the mesh (processes in order)
    is the batch."""
    cases = [(256, 2, 0), (256, 2, 1), (96, 4, 3)]
    if hidden:
        cases += [(8, 8, 5), (60, 3, 1), (32, 1, 0)]
    for b, n, p in cases:
        got = _rows(_call(process_rows, "process_rows", b, n, p), "process_rows")
        local = b // n
        want = list(range(p * local, (p + 1) * local))
        if got == want:
            continue
        if len(got) != local:
            _fail(f"process {p} of {n} loads {len(got)} rows of a batch of {b}: each loads "
                  f"b / num_processes = {local}")
        if got == list(range(p, b, n)):
            _fail("every num_processes-th row is interleaved: process p must load one "
                  "contiguous block, because the global array's rows follow the devices in "
                  "mesh order, process 0's first")
        if got and (got[0] == (p + 1) * local or got[0] == p * local + 1):
            _fail(f"off by one: process {p}'s block starts at row {got[0]}; process 0's "
                  f"starts at row 0")
        _fail(f"process {p} of {n} loads rows {got[:3]}... of a batch of {b}")
    return "one contiguous block per process, in process order"
