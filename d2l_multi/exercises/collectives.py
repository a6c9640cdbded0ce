"""The checks of the exercises of notebook 07a_collectives."""
from ._common import _call, _close, _exercise, _fail, _number, _times

# --------------------------------------------------------------------------------------------
# 07a: collectives and the alpha-beta model

@_exercise("07a_collectives")
def alpha_beta(allreduce_time, hidden=False):
    """``allreduce_time(n, k, alpha, beta)``: the alpha-beta model's seconds for a ring
    allreduce of n bytes on k devices (alpha seconds per step, beta seconds per byte)."""
    cases = [(8, 1e-5, 1e-10), (4, 2e-6, 5e-11)]
    if hidden:
        cases += [(2, 1e-4, 1e-9), (16, 3e-6, 2e-11)]
    for k, alpha, beta in cases:
        def model(n):
            return _number(_call(allreduce_time, "allreduce_time", n, k, alpha, beta),
                           "allreduce_time")
        tiny, large = model(4.0), model(4e9)  # alpha dominates the first, beta the second
        want_tiny = 2 * (k - 1) * alpha + 2 * (k - 1) / k * 4.0 * beta
        want_large = 2 * (k - 1) * alpha + 2 * (k - 1) / k * 4e9 * beta
        if _close(tiny, want_tiny, rtol=1e-6) and _close(large, want_large, rtol=1e-6):
            continue
        if not _close(tiny, want_tiny, rtol=1e-3):
            _fail(f"for a tiny message (4 bytes, k={k}) your time is "
                  f"{_times(tiny, want_tiny)}: every step of the ring pays the start-up "
                  f"alpha; how many steps does a ring allreduce take?")
        if _close(large / want_large, k, rtol=1e-2):
            _fail(f"for large messages your time is {k}\u00d7 too large: each step moves n/k "
                  f"bytes, not n")
        if _close(large / want_large, 0.5, rtol=1e-2):
            _fail("for large messages your time is half the model's: the bytes cross the ring "
                  "twice (reduce-scatter, then all-gather)")
        _fail(f"for a large message (4e9 bytes, k={k}) your time is "
              f"{_times(large, want_large)}: count the bytes each device sends")
    return "2(k-1) alpha + 2(k-1)/k n beta"


@_exercise("07a_collectives")
def bus_bandwidth(bus_bandwidth, hidden=False):
    """``bus_bandwidth(collective, k, n, seconds)``: nccl-tests' bus bandwidth in bytes/s of
    'psum', 'all_gather' or 'psum_scatter' moving n bytes in ``seconds`` on k devices."""
    factors = {"psum": lambda k: 2 * (k - 1) / k, "all_gather": lambda k: (k - 1) / k,
               "psum_scatter": lambda k: (k - 1) / k}
    cases = [("psum", 8, 2**20, 1e-3), ("all_gather", 8, 2**20, 1e-3),
             ("psum_scatter", 4, 2**24, 2e-3)]
    if hidden:
        cases += [("psum", 2, 10**6, 1e-4), ("all_gather", 16, 3 * 2**20, 5e-3)]
    for collective, k, n, t in cases:
        got = _number(_call(bus_bandwidth, "bus_bandwidth", collective, k, n, t),
                      "bus_bandwidth")
        want = n / t * factors[collective](k)
        if _close(got, want, rtol=1e-6):
            continue
        if _close(got, n / t):
            _fail(f"that is the algorithm bandwidth n/t of {collective}: the bus bandwidth "
                  f"multiplies it by the fraction of the data each device's link carries")
        if collective != "psum" and _close(got, n / t * 2 * (k - 1) / k):
            _fail(f"{collective} is one phase of the ring, not two")
        if collective == "psum" and _close(got, n / t * (k - 1) / k):
            _fail("an allreduce crosses the ring twice (reduce-scatter, then all-gather)")
        _fail(f"for {collective} on {k} devices your bus bandwidth is {_times(got, want)}")
    return "algorithm bandwidth \u00d7 the collective's factor"
