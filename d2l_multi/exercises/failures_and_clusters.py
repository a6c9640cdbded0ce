"""The checks of the exercises of notebook 11b_failures_and_clusters."""
import math

from ._common import _call, _close, _exercise, _fail, _number, _times

# --------------------------------------------------------------------------------------------
# 11b: failures and clusters

@_exercise("11b_failures_and_clusters")
def checkpoint_interval(checkpoint_interval, hidden=False):
    """``checkpoint_interval(save_seconds, device_mtbf_seconds, num_devices)``: Young's
    optimal time between checkpoints for a job on ``num_devices`` devices that each fail on
    average once in ``device_mtbf_seconds``."""
    year = 365 * 24 * 3600
    cases = [(120, 5 * year, 1000), (30, year, 64), (600, 2 * year, 1)]
    if hidden:
        cases += [(5, 10 * year, 10**4), (60, 0.5 * year, 8)]
    for c, mtbf, n in cases:
        got = _number(_call(checkpoint_interval, "checkpoint_interval", c, mtbf, n),
                      "checkpoint_interval")
        job = mtbf / n
        want = math.sqrt(2 * c * job)
        if _close(got, want, rtol=1e-6):
            continue
        if n > 1 and _close(got, math.sqrt(2 * c * mtbf)):
            _fail(f"with {n} devices the job fails {n} times as often as one device: its "
                  f"mean time between failures is the device's divided by {n}")
        if _close(got, want / math.sqrt(2)):
            _fail("\u221a2 too small: Young's interval balances the time spent saving "
                  "against the expected work lost, half an interval per failure")
        if _close(got, want ** 2):
            _fail("that is in seconds squared: take the square root")
        _fail(f"{_times(got, want)} for {n} devices")
    return "Young's sqrt(2 \u00d7 save time \u00d7 the job's MTBF)"
