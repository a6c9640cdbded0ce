"""The cost model of notebook 07: collectives timed, alpha and beta recovered from synthetic
timings, FLOPs from the compiled program, and a prediction that moves the right way."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import d2l_multi as d2l

ALPHA, BETA = 40e-6, 1 / 2e9  # 40 µs, 2 GB/s
SIZES = np.array([2 ** i for i in range(10, 26, 2)], float)


@pytest.mark.parametrize("collective", ["psum", "all_gather", "psum_scatter", "ppermute"])
def test_each_collective_compiles_to_its_own_operation(collective):
    program, x, calls = d2l.collective_loop(collective, 4, 1 << 16)
    counts = d2l.count_collectives(program.lower(x).compile().as_text())
    name = {"psum": "all-reduce", "all_gather": "all-gather", "psum_scatter": "reduce-scatter",
            "ppermute": "collective-permute"}[collective]
    assert counts[name] == 1 and sum(counts.values()) == 1, counts
    assert calls == 32  # 64 KB: up to 4 MB of traffic, at most 32 calls
    size = 1 << 14 if collective == "all_gather" else 4 << 14  # float32 elements, all devices
    assert x.shape == (size,)


def test_psum_loop_computes_the_sum():
    program, x, calls = d2l.collective_loop("psum", 2, 1 << 20)
    assert calls == 4
    x = jax.device_put(jnp.ones_like(x), x.sharding)
    np.testing.assert_allclose(program(x), 2.0 ** calls)  # every call doubles the ones


def test_time_collective_returns_positive_samples():
    times = d2l.time_collective("ppermute", 2, 4096, repeat=3)
    assert times.shape == (3,) and np.all(times > 0)


@pytest.mark.parametrize("call,message", [
    (lambda: d2l.collective_loop("broadcast", 2, 4096), "got .broadcast., 2"),
    (lambda: d2l.collective_loop("psum", 1, 4096), "on num_devices >= 2, got .psum., 1"),
    (lambda: d2l.collective_loop("psum", 8, 1000), "use a multiple of 32, e.g. 992 or 1024"),
    (lambda: d2l.collective_loop("psum", 2, -8), "num_bytes must be a positive integer"),
    (lambda: d2l.time_collective("psum", 2, 4096, repeat=0),
     "repeat must be a positive integer"),
    (lambda: d2l.bus_bandwidth("psum", 2, 4096, 0.0), "seconds must be a finite positive"),
    (lambda: d2l.bus_bandwidth("gather", 2, 4096, 1.0), "unknown collective .gather."),
])
def test_bad_collective_arguments_are_named(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_an_ideal_ring_shows_the_link_bandwidth_on_any_number_of_devices():
    """What bus bandwidth is for (nccl-tests): it takes the device count out, so collectives
    that run at the link's speed show the link's bandwidth on 2, 4 or 8 devices. The
    allreduce's time is the cost model's ring; gathers move (k-1)/k of the data over each
    link, a permute all of it."""
    link, n = 50e9, float(1 << 24)
    for k in (2, 4, 8):
        ideal = {"psum": d2l.predict_step_time(0.0, k, n, 0.0, 1 / link),
                 "all_gather": (k - 1) / k * n / link, "psum_scatter": (k - 1) / k * n / link,
                 "ppermute": n / link}
        for collective, seconds in ideal.items():
            algbw, busbw = d2l.bus_bandwidth(collective, k, n, seconds)
            assert algbw == pytest.approx(n / seconds)
            assert busbw == pytest.approx(link), (collective, k)


def test_measure_collectives_rows():
    rows = d2l.measure_collectives(["psum"], [2, 4], [8192, 2048], repeat=2)
    assert [(r["devices"], r["bytes"]) for r in rows] == [(2, 2048), (2, 8192), (4, 2048),
                                                          (4, 8192)]
    for r in rows:  # each row reports the bandwidths of its median time
        assert r["low"] <= r["seconds"] <= r["high"]
        assert r["algbw"] == pytest.approx(r["bytes"] / r["seconds"])
        assert r["busbw"] >= r["algbw"]  # an allreduce moves more than its size per link


def test_fit_recovers_alpha_and_beta_from_noisy_timings():
    rng = np.random.default_rng(0)
    times = (ALPHA + BETA * SIZES) * rng.uniform(0.95, 1.05, SIZES.shape)
    alpha, beta = d2l.fit_alpha_beta(SIZES, times)
    assert alpha == pytest.approx(ALPHA, rel=0.1) and beta == pytest.approx(BETA, rel=0.1)


def test_fit_is_exact_without_noise_and_never_negative():
    assert d2l.fit_alpha_beta(SIZES, ALPHA + BETA * SIZES) == pytest.approx((ALPHA, BETA))
    alpha, beta = d2l.fit_alpha_beta(SIZES, BETA * SIZES * 1.5 - 1e-7 + 1e-12)
    assert alpha == 0.0 and beta > 0   # the best line would cross below 0 at n = 0
    alpha, beta = d2l.fit_alpha_beta([1e3, 1e6], [2e-3, 1e-3])
    assert beta == 0.0 and alpha > 0    # times that fall with size: constant at best


def test_per_device_count_fits_give_the_ring_hop_latency_and_link_bandwidth():
    ring = d2l.ring_per_hop
    for k in (2, 4, 8):
        t = [d2l.predict_step_time(0.0, k, float(n), 5e-6, 1 / 100e9) for n in SIZES]
        assert ring(*d2l.fit_alpha_beta(SIZES, t), k) == pytest.approx((5e-6, 1 / 100e9))


@pytest.mark.parametrize("args,message", [
    (([1, 2, 3], [1, 2]), "as many times as sizes"),
    (([1e3, 1e3], [1e-3, 2e-3]), "at least two different sizes"),
    (([1e3, 1e4], [1e-3, -1.0]), "all finite and > 0"),
    (([1e3, 1e4], [1e-3, float("nan")]), "all finite and > 0"),
])
def test_fit_refuses_bad_input(args, message):
    with pytest.raises(ValueError, match=message):
        d2l.fit_alpha_beta(*args)


def test_step_cost_counts_a_matrix_product():
    a = jnp.ones((64, 32))
    cost = d2l.step_cost(lambda a, b: a @ b, a, a.T)
    assert cost["flops"] == pytest.approx(2 * 64 * 32 * 64, rel=0.05)
    assert cost["bytes"] >= 4 * (2 * 64 * 32 + 64 * 64)
    compiled = jax.jit(lambda a, b: a @ b).lower(a, a.T).compile()
    assert d2l.step_cost(compiled) == cost


def test_cpu_time_call_counts_cpu_and_wall_seconds():
    cpu, wall = d2l.cpu_time_call(lambda x: (x @ x).sum(), jnp.ones((256, 256)), repeat=3)
    assert cpu > 0 and wall > 0
    with pytest.raises(ValueError, match="repeat must be a positive integer, got 0"):
        d2l.cpu_time_call(lambda x: x, 1.0, repeat=0)


def predict(**changes):
    args = dict(compute_time=10e-3, num_devices=8, grad_bytes=4e6, alpha=5e-6, beta=1 / 50e9,
                overlap=False, parallelism=None) | changes
    return d2l.predict_step_time(**args)


def test_prediction_is_compute_plus_the_ring_allreduce():
    ring = 2 * 7 * 5e-6 + 2 * 7 / 8 * 4e6 / 50e9
    assert predict() == pytest.approx(10e-3 + ring)
    assert predict(num_devices=1) == pytest.approx(10e-3)  # one device: nothing to sum
    assert predict(parallelism=2) == pytest.approx(4 * 10e-3 + ring)  # 8 devices, 2 cores
    assert predict(parallelism=1.6) == pytest.approx(5 * 10e-3 + ring)  # cores shared


def test_prediction_grows_with_every_cost_and_shrinks_with_overlap():
    base = predict()
    for name, more in [("compute_time", 20e-3), ("grad_bytes", 8e6), ("alpha", 1e-5),
                       ("beta", 1 / 10e9), ("num_devices", 16)]:
        assert predict(**{name: more}) > base, name
    assert predict(parallelism=4) > base == predict(parallelism=8) > predict(parallelism=16)
    assert predict(overlap=True) <= base
    assert predict(overlap=True) == pytest.approx(max(10e-3, 10e-3 / 3 + predict(
        compute_time=0.0)))  # hidden behind the backward pass while it is long enough
    small = predict(compute_time=1e-6, overlap=True)
    assert small == pytest.approx(1e-6 / 3 + predict(compute_time=0.0))  # latency shows


def test_strong_scaling_saturates_and_weak_scaling_keeps_the_allreduce():
    per_example, fixed = 1e-4, 1e-3
    strong = [predict(compute_time=fixed + per_example * 256 / k, num_devices=k)
              for k in (1, 2, 4, 8)]
    assert strong == sorted(strong, reverse=True)          # fewer examples per device
    weak = [predict(compute_time=fixed + per_example * 32, num_devices=k) for k in (1, 2, 4, 8)]
    assert weak == sorted(weak)                            # the same work plus a longer ring


@pytest.mark.parametrize("changes,message", [
    (dict(num_devices=0), "num_devices must be a positive integer, got 0"),
    (dict(num_devices=2.0), "num_devices must be a positive integer, got 2.0"),
    (dict(parallelism=0), "parallelism must be a finite positive number, got 0"),
    (dict(compute_time=-1.0), "compute_time must be a finite number >= 0, got -1.0"),
    (dict(compute_time=float("nan")), "compute_time must be a finite number >= 0, got nan"),
    (dict(alpha=-1e-6), "alpha must be a finite number >= 0"),
    (dict(grad_bytes=-1), "grad_bytes must be a finite number >= 0"),
])
def test_prediction_refuses_bad_input(changes, message):
    with pytest.raises(ValueError, match=message):
        predict(**changes)
