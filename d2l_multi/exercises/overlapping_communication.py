"""The checks of the exercises of notebook 09e_overlapping_communication."""
from ._common import _call, _close, _exercise, _fail, _number, _observe

# --------------------------------------------------------------------------------------------
# 09e: overlapping communication


def _play_buckets(backward, comm, num_buckets):
    """Play the step event by event: the backward pass hands over a bucket every
    ``backward / num_buckets`` seconds; the link all-reduces one bucket at a time, each for
    ``comm / num_buckets`` seconds, in the order they come. Returns when the link is done."""
    link_free = 0.0
    for i in range(num_buckets):                  # the buckets, as the backward pass hands them
        ready = (i + 1) * backward / num_buckets
        start = max(ready, link_free)             # the link takes one when both are there
        link_free = start + comm / num_buckets
    return link_free


@_exercise("09e_overlapping_communication", cases=[(1.0, 0.4, 4), (1.0, 2.0, 4), (0.3, 0.3, 1)],
           passed="the time of the step played bucket by bucket")
def overlapped_step(step_time, case):
    """``step_time(backward, comm, num_buckets)``: seconds until the last gradient is
    all-reduced when the backward pass (``backward`` seconds) produces the gradient in
    ``num_buckets`` equal buckets, each all-reduced (``comm`` / ``num_buckets`` seconds, one at
    a time) as soon as it is ready."""
    t_b, t_c, b = case
    got = _observe(lambda: _number(_call(step_time, "step_time", t_b, t_c, b), "step_time"))
    want = _play_buckets(t_b, t_c, b)
    if _close(got, want, rtol=1e-9):
        return
    if _close(got, max(t_b, t_c)):
        _fail("perfect overlap is impossible: the last bucket's all-reduce can start only when "
              "the backward pass has produced it")
    if _close(got, t_b + t_c):
        _fail("that is no overlap at all: each bucket's all-reduce starts as soon as the "
              "backward pass has produced it")
    if _close(got, t_b + t_c / b):
        _fail(f"for backward={t_b:g} s, comm={t_c:g} s the link is the bottleneck: the "
              f"all-reduces queue up behind each other; when can the first one start?")
    _fail(f"for backward={t_b:g} s, comm={t_c:g} s, {b} buckets you give {got:.4g} s")
