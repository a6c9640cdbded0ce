"""The checks of the exercises of notebook 09d_pipeline_parallelism."""
from ._common import _call, _close, _exercise, _fail, _number

# --------------------------------------------------------------------------------------------
# 09d: pipeline parallelism

@_exercise("09d_pipeline_parallelism")
def gpipe_bubble(bubble, hidden=False):
    """``bubble(p, m)``: the fraction of a GPipe schedule each of p stages is idle with m
    micro-batches."""
    cases = [(4, 8), (8, 32), (2, 1)] + ([(1, 5), (16, 3), (6, 100)] if hidden else [])
    for p, m in cases:
        got = _number(_call(bubble, "bubble", p, m), "bubble")
        want = (p - 1) / (m + p - 1)
        if _close(got, want, rtol=1e-9, atol=1e-12):
            continue
        if _close(got, (p - 1) / m):
            _fail("that is the idle time relative to the useful work; the fraction of the "
                  "schedule divides by the schedule's whole length")
        if _close(got, p / (m + p)) or _close(got, p / (m + p - 1)) or _close(
                got, (p - 1) / (m + p)):
            _fail(f"off by one (p={p}, m={m}): count the schedule's slots again: when does "
                  f"the last stage start, and when does the first one finish?")
        if not 0 <= got < 1:
            _fail(f"{got:g} is not a fraction of the time")
        _fail(f"for p={p} stages and m={m} micro-batches you give {got:.4g}")
    return "(p - 1) / (m + p - 1)"


@_exercise("09d_pipeline_parallelism")
def one_f_one_b(one_f_one_b, hidden=False):
    """``one_f_one_b(p, m)`` -> (idle fraction of each stage, the most micro-batches whose
    activations the first stage holds at once) for the 1F1B schedule."""
    cases = [(4, 8), (8, 32), (4, 2)] + ([(1, 4), (16, 64), (3, 3)] if hidden else [])
    for p, m in cases:
        out = _call(one_f_one_b, "one_f_one_b", p, m)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            _fail("return two numbers: (idle fraction, micro-batches in flight)")
        bubble = _number(out[0], "one_f_one_b")
        held = _number(out[1], "one_f_one_b")
        want = (p - 1) / (m + p - 1)
        if bubble < want * (1 - 1e-9):
            _fail("1F1B does not shrink the bubble: it idles as much as GPipe; what it saves "
                  "is memory")
        if not _close(bubble, want, rtol=1e-9):
            _fail(f"the idle fraction for p={p}, m={m} is wrong: 1F1B idles as much as GPipe")
        if held == m and m > p:
            _fail(f"{m} micro-batches held is GPipe: in 1F1B the first stage starts a "
                  f"backward pass as soon as the first micro-batch returns, so it holds at "
                  f"most p")
        if held == p and m < p:
            _fail(f"with m={m} micro-batches for p={p} stages, no stage can hold more than m")
        if held != min(p, m):
            _fail(f"the first stage holds {held:g} micro-batches at once for p={p}, m={m}: "
                  f"count the forwards it runs before its first backward")
    return "the same bubble as GPipe, at most min(p, m) micro-batches in flight"
