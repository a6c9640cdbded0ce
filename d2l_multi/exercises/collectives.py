"""The checks of the exercises of notebook 07a_collectives."""
from ._common import (
    _call,
    _close,
    _exercise,
    _fail,
    _number,
    _observe,
    _ring_bytes_per_device,
    _ring_seconds,
    _times,
)

# --------------------------------------------------------------------------------------------
# 07a: collectives and the alpha-beta model


@_exercise("07a_collectives", cases=[(8, 1e-5, 1e-10), (4, 2e-6, 5e-11)],
           passed="the time of a ring played step by step, for tiny and for large messages")
def alpha_beta(allreduce_time, case):
    """``allreduce_time(n, k, alpha, beta)``: the alpha-beta model's seconds for a ring
    allreduce of n bytes on k devices (alpha seconds per step, beta seconds per byte)."""
    k, alpha, beta = case
    tiny, large = _observe(lambda: tuple(
        _number(_call(allreduce_time, "allreduce_time", n, k, alpha, beta), "allreduce_time")
        for n in (4.0, 4e9)))  # alpha dominates the first, beta the second
    want_tiny = _ring_seconds(k, 4.0, alpha, beta)
    want_large = _ring_seconds(k, 4e9, alpha, beta)
    if _close(tiny, want_tiny, rtol=1e-6) and _close(large, want_large, rtol=1e-6):
        return
    if not _close(tiny, want_tiny, rtol=1e-3):
        _fail(f"for a tiny message (4 bytes, k={k}) your time is {_times(tiny, want_tiny)}: "
              f"every step of the ring pays the start-up alpha; how many steps does a ring "
              f"allreduce take?")
    if _close(large / want_large, k, rtol=1e-2):
        _fail(f"for large messages your time is {k}\u00d7 too large: each step moves n/k "
              f"bytes, not n")
    if _close(large / want_large, 0.5, rtol=1e-2):
        _fail("for large messages your time is half the model's: the bytes cross the ring "
              "twice (reduce-scatter, then all-gather)")
    _fail(f"for a large message (4e9 bytes, k={k}) your time is "
          f"{_times(large, want_large)}: count the bytes each device sends")


_PHASES = {"psum": ("reduce-scatter", "all-gather"), "all_gather": ("all-gather",),
           "psum_scatter": ("reduce-scatter",)}


@_exercise("07a_collectives", cases=[("psum", 8, 2**20, 1e-3), ("all_gather", 8, 2**20, 1e-3),
                                     ("psum_scatter", 4, 2**24, 2e-3)],
           passed="the bytes each device's link carries in a played ring, per second")
def bus_bandwidth(bus_bandwidth, case):
    """``bus_bandwidth(collective, k, n, seconds)``: nccl-tests' bus bandwidth in bytes/s of
    'psum', 'all_gather' or 'psum_scatter' moving n bytes in ``seconds`` on k devices."""
    collective, k, n, t = case
    got = _observe(lambda: _number(_call(bus_bandwidth, "bus_bandwidth", collective, k, n, t),
                                   "bus_bandwidth"))
    want = _ring_bytes_per_device(k, n, _PHASES[collective]) / t
    if _close(got, want, rtol=1e-6):
        return
    if _close(got, n / t):
        _fail(f"that is the algorithm bandwidth n/t of {collective}: the bus bandwidth "
              f"multiplies it by the fraction of the data each device's link carries")
    two_phases = _ring_bytes_per_device(k, n) / t
    if collective != "psum" and _close(got, two_phases):
        _fail(f"{collective} is one phase of the ring, not two")
    if collective == "psum" and _close(got, two_phases / 2):
        _fail("an allreduce crosses the ring twice (reduce-scatter, then all-gather)")
    _fail(f"for {collective} on {k} devices your bus bandwidth is {_times(got, want)}")
