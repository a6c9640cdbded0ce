"""When do more devices help? Time collectives and compute, fit the alpha-beta model, and
predict the step time of data parallelism on k devices (notebook 07)."""
import itertools
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import d2l_multi as d2l


def check_collective_inputs(collective, ops, num_devices, num_bytes):
    """Raise a ValueError unless ``collective`` is in ``ops``, k >= 2 and 4k divides num_bytes."""
    k = num_devices
    if collective not in ops or not isinstance(k, int) or k < 2:
        raise ValueError(f"use one of {list(ops)} on num_devices >= 2, got {collective!r}, {k!r}")
    d2l.check_positive(num_bytes=num_bytes)
    d2l.check_divisible(num_bytes, 4 * k, "num_bytes", f"float32 blocks of {k} devices")


def collective_loop(collective, num_devices, num_bytes):
    """(program, input, calls): ``collective`` in a ``shard_map`` loop on ``num_devices``."""
    k = num_devices
    ops = {"psum": lambda x: lax.psum(x, "data"),
           "all_gather": lambda x: lax.all_gather(x, "data", tiled=True)[:x.size],
           "psum_scatter": lambda x: x.at[:x.size // k].set(
               lax.psum_scatter(x, "data", tiled=True)),
           "ppermute": lambda x: lax.ppermute(x, "data", [(i, (i + 1) % k) for i in range(k)])}
    d2l.check_collective_inputs(collective, ops, k, num_bytes)
    calls = int(np.clip(2 ** 22 // num_bytes, 1, 32))  # up to 4 MB of traffic per program
    loop = lambda x: lax.fori_loop(0, calls, lambda i, x: ops[collective](x), x)
    mesh = d2l.device_mesh((k,))
    program = jax.jit(jax.shard_map(loop, mesh=mesh, in_specs=P("data"), out_specs=P("data"),
                                    check_vma=False))
    size = num_bytes // 4 * (1 if collective == "all_gather" else k)
    return program, d2l.shard(jnp.zeros(size), mesh, P("data")), calls


def time_collective(collective, num_devices, num_bytes, repeat=5):
    """Seconds per call of the collective: ``repeat`` samples, the first after compiling."""
    d2l.check_positive(repeat=repeat)
    program, x, calls = collective_loop(collective, num_devices, num_bytes)
    return np.array([d2l.time_call(program, x, repeat=1, warmup=int(i == 0)) / calls
                     for i in range(repeat)])


def bus_bandwidth(collective, num_devices, num_bytes, seconds):
    """nccl-tests' algorithm bandwidth S/t and bus bandwidth S/t * f, in bytes per second."""
    k = num_devices
    f = {"psum": 2 * (k - 1) / k, "all_gather": (k - 1) / k, "psum_scatter": (k - 1) / k,
         "ppermute": 1.0}
    if collective not in f:
        raise ValueError(f"unknown collective {collective!r}; use one of {list(f)}")
    d2l.check_positive(num_devices=k, seconds=seconds)
    return num_bytes / seconds, num_bytes / seconds * f[collective]


def measure_collectives(collectives, device_counts, sizes, repeat=5):
    """Time each collective on each device count at each size: rows with the median, the
    fastest and the slowest sample, and both bandwidths. Smoke switch: the 3 smallest sizes."""
    rows = []
    sizes = sorted(sizes)[:d2l.shrink(len(sizes), 3)]
    for collective, k, n in itertools.product(collectives, device_counts, sizes):
        times = time_collective(collective, k, n, repeat)
        t = float(np.median(times))
        algbw, busbw = bus_bandwidth(collective, k, n, t)
        rows.append(dict(collective=collective, devices=k, bytes=n, seconds=t,
                         low=times.min(), high=times.max(), algbw=algbw, busbw=busbw))
    return rows


def check_alpha_beta_inputs(num_bytes, seconds):
    """Raise a ValueError unless each size has a time, all finite and > 0, and two sizes differ."""
    n, t = np.asarray(num_bytes, float), np.asarray(seconds, float)
    if n.ndim != 1 or n.shape != t.shape or len(np.unique(n)) < 2 or not np.all(
            np.isfinite(n * t) & (n > 0) & (t > 0)):
        raise ValueError(f"need as many times as sizes, at least two different sizes, all finite "
                         f"and > 0 (drop failed measurements); got {n.tolist()}, {t.tolist()}")


def fit_alpha_beta(num_bytes, seconds):
    """(alpha, beta) >= 0 of ``seconds = alpha + beta num_bytes``, by relative least squares."""
    n, t = np.asarray(num_bytes, float), np.asarray(seconds, float)
    d2l.check_alpha_beta_inputs(n, t)
    A = np.stack([1 / t, n / t], axis=1)              # relative error: each row divided by t
    alpha, beta = np.linalg.lstsq(A, np.ones_like(t), rcond=None)[0]
    if alpha < 0 or beta < 0:                         # the best fit with that one at 0
        column = A[:, 0] if beta < 0 else A[:, 1]
        value = column.sum() / (column ** 2).sum()
        alpha, beta = (value, 0.0) if beta < 0 else (0.0, value)
    return float(alpha), float(beta)


def check_cost_analysis(cost):
    """Raise a ValueError if the backend's ``cost_analysis()`` gave no FLOP count."""
    if not cost or "flops" not in cost:
        raise ValueError(f"the {jax.default_backend()} backend reports no cost analysis for "
                         f"this program; count its FLOPs by hand")


def step_cost(step, *args):
    """FLOPs and bytes accessed that XLA counts in ``step(*args)`` or a compiled ``step``."""
    compiled = step if hasattr(step, "cost_analysis") else jax.jit(step).lower(*args).compile()
    cost = compiled.cost_analysis()
    d2l.check_cost_analysis(cost)
    return {"flops": cost["flops"], "bytes": cost.get("bytes accessed", 0.0)}


def measure_compute(step, make_args, batch_sizes, repeat=5):
    """For each batch size b, compile ``step(*make_args(b))``, time it on one device
    (``d2l.time_call``) and count its cost: one row per size. Smoke switch: the 2 smallest."""
    rows = []
    for b in sorted(batch_sizes)[:d2l.shrink(len(batch_sizes), 2)]:
        d2l.check_positive(batch_size=b)
        args = make_args(b)
        compiled = jax.jit(step).lower(*args).compile()
        rows.append(dict(batch=b, seconds=d2l.time_call(compiled, *args, repeat=repeat),
                         **step_cost(compiled)))
    return rows


def cpu_time_call(f, *args, repeat=5):
    """CPU seconds (of every thread of this process) and wall-clock seconds per call of
    ``f(*args)``, means over ``repeat`` calls after one that compiles; their ratio is the number
    of cores the calls kept busy (``d2l.shrink`` keeps 2 calls in quick runs)."""
    d2l.check_positive(repeat=repeat)
    jax.block_until_ready(f(*args))
    repeat = d2l.shrink(repeat, 2)
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(repeat):
        jax.block_until_ready(f(*args))
    return (time.process_time() - cpu) / repeat, (time.perf_counter() - wall) / repeat


def check_step_time_inputs(compute_time, grad_bytes, alpha, beta):
    """Raise a ValueError unless the compute time is finite and all four are >= 0."""
    if not (math.isfinite(compute_time) and min(compute_time, grad_bytes, alpha, beta) >= 0):
        raise ValueError(f"compute_time, grad_bytes, alpha and beta must be finite and >= 0, got "
                         f"{compute_time}, {grad_bytes}, {alpha}, {beta}")


def predict_step_time(compute_time, num_devices, grad_bytes, alpha, beta, overlap=False,
                      parallelism=None):
    """Seconds of a data-parallel step: k shares, ``parallelism`` at a time, a ring allreduce."""
    k = num_devices
    parallelism = k if parallelism is None else parallelism
    d2l.check_positive(num_devices=k, parallelism=parallelism)
    d2l.check_step_time_inputs(compute_time, grad_bytes, alpha, beta)
    compute = compute_time * k / parallelism
    allreduce = 2 * (k - 1) * alpha + 2 * (k - 1) / k * grad_bytes * beta
    backward = 2 / 3 * compute if overlap else 0.0
    return compute - backward + max(backward, allreduce)
