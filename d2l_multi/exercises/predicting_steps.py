"""The checks of the exercises of notebook 07b_predicting_steps."""
from ._common import _call, _close, _exercise, _fail, _number, _observe, _ring_seconds, _times

# --------------------------------------------------------------------------------------------
# 07b: predicting a data-parallel step


@_exercise("07b_predicting_steps",
           cases=[(0.8, 8, 4e8, 1e-5, 1e-10), (0.05, 2, 4e6, 5e-6, 1e-9),
                  (2.0, 1, 4e9, 1e-5, 1e-10)],
           passed="each device's share of the compute, then a ring played step by step")
def step_time(predict_step_time, case):
    """``predict_step_time(compute_time, k, grad_bytes, alpha, beta)``: seconds of a
    data-parallel step on k devices, ``compute_time`` being one device's time for the whole
    global batch; the allreduce follows the compute (no overlap)."""
    compute, k, g, alpha, beta = case
    got = _observe(lambda: _number(_call(predict_step_time, "predict_step_time", compute, k, g,
                                         alpha, beta), "predict_step_time"))
    share = compute / k                       # each device computes 1/k of the batch
    comm = _ring_seconds(k, g, alpha, beta)   # then the gradient goes round the ring
    want = share + comm
    if _close(got, want, rtol=1e-6):
        return
    if k > 1 and _close(got, compute + comm):
        _fail(f"each of the {k} devices computes 1/{k} of the global batch: divide the compute "
              f"time by k")
    if k > 1 and _close(got, share):
        _fail("no communication: add the ring allreduce of the gradient")
    if k == 1:
        _fail("on one device there is no allreduce: the step is the compute alone")
    if _close(got, max(share, comm)):
        _fail("the allreduce waits for the gradient here (no overlap): add the two times")
    _fail(f"for {k} devices your step time is {_times(got, want)}")
