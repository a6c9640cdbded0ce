"""The checks of the exercises of notebook 09e_overlapping_communication."""
from ._common import _call, _close, _exercise, _fail, _number

# --------------------------------------------------------------------------------------------
# 09e: overlapping communication

def _bucketed(backward, comm, b):
    done = 0.0
    for i in range(b):  # bucket i is ready at (i+1)/b of the backward pass; one link
        done = max(done, (i + 1) * backward / b) + comm / b
    return done


@_exercise("09e_overlapping_communication")
def overlapped_step(step_time, hidden=False):
    """``step_time(backward, comm, num_buckets)``: seconds until the last gradient is
    all-reduced when the backward pass (``backward`` seconds) produces the gradient in
    ``num_buckets`` equal buckets, each all-reduced (``comm`` / ``num_buckets`` seconds, one at
    a time) as soon as it is ready."""
    cases = [(1.0, 0.4, 4), (1.0, 2.0, 4), (0.3, 0.3, 1)]
    if hidden:
        cases += [(2.0, 0.5, 10), (0.5, 3.0, 8), (1.0, 1.0, 3)]
    for t_b, t_c, b in cases:
        got = _number(_call(step_time, "step_time", t_b, t_c, b), "step_time")
        want = _bucketed(t_b, t_c, b)
        if _close(got, want, rtol=1e-9):
            continue
        if _close(got, max(t_b, t_c)):
            _fail("perfect overlap is impossible: the last bucket's all-reduce can start only "
                  "when the backward pass has produced it")
        if _close(got, t_b + t_c):
            _fail("that is no overlap at all: each bucket's all-reduce starts as soon as the "
                  "backward pass has produced it")
        if _close(got, t_b + t_c / b):
            _fail(f"for backward={t_b:g} s, comm={t_c:g} s the link is the bottleneck: the "
                  f"all-reduces queue up behind each other; when can the first one start?")
        _fail(f"for backward={t_b:g} s, comm={t_c:g} s, {b} buckets you give {got:.4g} s")
    return "the last bucket's all-reduce after the backward pass, or the link's queue"
