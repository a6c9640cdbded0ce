"""The checks of the exercises of notebook 07b_predicting_steps."""
from ._common import _call, _close, _exercise, _fail, _number, _times

# --------------------------------------------------------------------------------------------
# 07b: predicting a data-parallel step

@_exercise("07b_predicting_steps")
def step_time(predict_step_time, hidden=False):
    """``predict_step_time(compute_time, k, grad_bytes, alpha, beta)``: seconds of a
    data-parallel step on k devices, ``compute_time`` being one device's time for the whole
    global batch; the allreduce follows the compute (no overlap)."""
    cases = [(0.8, 8, 4e8, 1e-5, 1e-10), (0.05, 2, 4e6, 5e-6, 1e-9), (2.0, 1, 4e9, 1e-5,
                                                                      1e-10)]
    if hidden:
        cases += [(1.0, 16, 1e9, 2e-6, 4e-11), (0.3, 4, 0.0, 1e-5, 1e-9)]
    for compute, k, g, alpha, beta in cases:
        got = _number(_call(predict_step_time, "predict_step_time", compute, k, g, alpha,
                            beta), "predict_step_time")
        comm = 2 * (k - 1) * alpha + 2 * (k - 1) / k * g * beta
        want = compute / k + comm
        if _close(got, want, rtol=1e-6):
            continue
        if k > 1 and _close(got, compute + comm):
            _fail(f"each of the {k} devices computes 1/{k} of the global batch: divide the "
                  f"compute time by k")
        if k > 1 and _close(got, compute / k):
            _fail("no communication: add the ring allreduce of the gradient")
        if k == 1 and not _close(got, want):
            _fail("on one device there is no allreduce: the step is the compute alone")
        if _close(got, max(compute / k, comm)):
            _fail("the allreduce waits for the gradient here (no overlap): add the two times")
        _fail(f"for {k} devices your step time is {_times(got, want)}")
    return "compute / k + the ring allreduce of the gradient"
