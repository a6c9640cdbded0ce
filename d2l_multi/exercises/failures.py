"""The checks of the exercises of notebook 11b_failures."""
import math

from ._common import _call, _close, _exercise, _fail, _number, _observe, _times

# --------------------------------------------------------------------------------------------
# 11b: failures and clusters


def _lost_fraction(interval, save_seconds, job_mtbf):
    """The fraction of a run lost to checkpoints taken every ``interval`` seconds, to first
    order: the time spent saving, and on average half an interval redone per failure."""
    return save_seconds / interval + interval / (2 * job_mtbf)


def _best_interval(save_seconds, job_mtbf):
    """The interval that loses the least, found by a golden-section search."""
    lo, hi = save_seconds * 1e-6, job_mtbf * 10
    ratio = (math.sqrt(5) - 1) / 2
    for _ in range(400):  # on the logarithm of the interval, to relative precision
        a = math.exp(math.log(hi) - ratio * (math.log(hi) - math.log(lo)))
        b = math.exp(math.log(lo) + ratio * (math.log(hi) - math.log(lo)))
        if _lost_fraction(a, save_seconds, job_mtbf) < _lost_fraction(b, save_seconds,
                                                                       job_mtbf):
            hi = b
        else:
            lo = a
        if hi / lo < 1 + 1e-13:
            break
    return math.sqrt(lo * hi)


_YEAR = 365 * 24 * 3600


@_exercise("11b_failures",
           cases=[(120, 5 * _YEAR, 1000), (30, _YEAR, 64), (600, 2 * _YEAR, 1)],
           passed="the interval that loses the least time, found by searching")
def checkpoint_interval(checkpoint_interval, case):
    """``checkpoint_interval(save_seconds, device_mtbf_seconds, num_devices)``: Young's
    optimal time between checkpoints for a job on ``num_devices`` devices that each fail on
    average once in ``device_mtbf_seconds``."""
    c, mtbf, n = case
    got = _observe(lambda: _number(_call(checkpoint_interval, "checkpoint_interval", c, mtbf,
                                         n), "checkpoint_interval"))
    want = _best_interval(c, mtbf / n)  # the job fails whenever one of its n devices does
    if _close(got, want, rtol=1e-6):
        return
    if n > 1 and _close(got, _best_interval(c, mtbf), rtol=1e-6):
        _fail(f"with {n} devices the job fails {n} times as often as one device: its mean "
              f"time between failures is the device's divided by {n}")
    if _close(got, want / math.sqrt(2), rtol=1e-6):
        _fail("\u221a2 too small: Young's interval balances the time spent saving against the "
              "expected work lost, half an interval per failure")
    if _close(got, want ** 2, rtol=1e-6):
        _fail("that is in seconds squared: take the square root")
    _fail(f"{_times(got, want)} for {n} devices")
