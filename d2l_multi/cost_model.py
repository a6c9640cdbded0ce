"""When do more devices help? Time collectives and compute, fit the alpha-beta model, and
predict the step time of data parallelism on k devices (notebook 07)."""
import math
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec as P

import d2l_multi as d2l


def collective_loop(collective, num_devices, num_bytes):
    """A program that calls ``collective`` in a loop inside ``jax.shard_map`` over the first
    ``num_devices`` devices, its float32 input, and the number of calls (up to 4 MB of traffic,
    1 to 32), so that the calls share one launch. ``collective`` is 'psum', 'all_gather',
    'psum_scatter' or 'ppermute' (to the next device). ``num_bytes`` is the size nccl-tests
    reports: each device's array for psum and psum_scatter, the gathered array for all_gather,
    the block each device sends for ppermute."""
    k = num_devices
    ops = {"psum": lambda x: lax.psum(x, "data"),
           "all_gather": lambda x: lax.all_gather(x, "data", tiled=True)[:x.size],
           "psum_scatter": lambda x: x.at[:x.size // k].set(
               lax.psum_scatter(x, "data", tiled=True)),
           "ppermute": lambda x: lax.ppermute(x, "data", [(i, (i + 1) % k) for i in range(k)])}
    if collective not in ops:
        raise ValueError(f"unknown collective {collective!r}; use one of {', '.join(ops)}")
    if isinstance(k, bool) or not isinstance(k, int) or k < 2:
        raise ValueError(f"a collective needs num_devices >= 2, got {k!r}")
    d2l.check_positive(num_bytes=num_bytes)
    d2l.check_divisible(num_bytes, 4 * k, "num_bytes", f"float32 blocks of {k} devices")
    calls = int(np.clip(2 ** 22 // num_bytes, 1, 32))
    loop = lambda x: lax.fori_loop(0, calls, lambda i, x: ops[collective](x), x)
    mesh = d2l.device_mesh((k,))
    program = jax.jit(jax.shard_map(loop, mesh=mesh, in_specs=P("data"),
                                    out_specs=P("data"), check_vma=False))
    size = num_bytes // 4 if collective == "all_gather" else k * num_bytes // 4
    x = jax.device_put(jnp.zeros(size, jnp.float32), NamedSharding(mesh, P("data")))
    return program, x, calls


def time_collective(collective, num_devices, num_bytes, repeat=5):
    """Seconds per call of ``collective`` on ``num_devices`` devices for ``num_bytes``
    (``collective_loop``): ``repeat`` samples (2 with the smoke switch on), after a warm-up
    call that compiles."""
    if isinstance(repeat, bool) or not isinstance(repeat, int) or repeat < 1:
        raise ValueError(f"repeat must be a positive integer, got {repeat!r}")
    program, x, calls = collective_loop(collective, num_devices, num_bytes)
    jax.block_until_ready(program(x))
    times = []
    for _ in range(d2l.shrink(repeat, 2)):
        start = time.perf_counter()
        jax.block_until_ready(program(x))
        times.append((time.perf_counter() - start) / calls)
    return np.array(times)


def bus_bandwidth(collective, num_devices, num_bytes, seconds):
    """nccl-tests' algorithm bandwidth (bytes / time) and bus bandwidth (the algorithm
    bandwidth times 2(k-1)/k for psum, (k-1)/k for all_gather and psum_scatter, 1 for
    ppermute), both in bytes per second."""
    k = num_devices
    factors = {"psum": 2 * (k - 1) / k, "all_gather": (k - 1) / k,
               "psum_scatter": (k - 1) / k, "ppermute": 1.0}
    if collective not in factors:
        raise ValueError(f"unknown collective {collective!r}; use one of {', '.join(factors)}")
    d2l.check_positive(num_devices=k, num_bytes=num_bytes, seconds=seconds)
    algbw = num_bytes / seconds
    return algbw, algbw * factors[collective]


def measure_collectives(collectives, device_counts, sizes, repeat=5):
    """Time every collective on every device count at every size (bytes): a list of rows with
    the median and the spread (min, max) of the samples and both bandwidths. With the smoke
    switch on, only the 5 smallest sizes."""
    sizes = sorted(sizes)[:d2l.shrink(len(sizes), 5)]
    rows = []
    for collective in collectives:
        for k in device_counts:
            for num_bytes in sizes:
                times = time_collective(collective, k, num_bytes, repeat)
                seconds = float(np.median(times))
                algbw, busbw = bus_bandwidth(collective, k, num_bytes, seconds)
                rows.append(dict(collective=collective, devices=k, bytes=num_bytes,
                                 seconds=seconds, low=float(times.min()),
                                 high=float(times.max()), algbw=algbw, busbw=busbw))
    return rows


def fit_alpha_beta(num_bytes, seconds, num_devices=None):
    """Fit ``seconds = alpha + num_bytes * beta`` (Hockney's model) by least squares on the
    relative error, with alpha, beta >= 0; return (alpha, beta).

    With ``num_devices`` (one count, or one per sample) fit the ring allreduce instead:
    ``seconds = 2(k-1) alpha + 2(k-1)/k num_bytes beta``, alpha per hop, beta per byte of a link.
    """
    n, t = np.asarray(num_bytes, float), np.asarray(seconds, float)
    if n.ndim != 1 or n.shape != t.shape:
        raise ValueError(f"num_bytes and seconds must be two lists of the same length, got "
                         f"shapes {n.shape} and {t.shape}")
    if len(np.unique(n)) < 2:
        raise ValueError(f"fitting two parameters needs at least two different sizes, got "
                         f"{n.tolist()}; measure more sizes")
    if not (np.all(np.isfinite(n)) and np.all(n > 0) and np.all(np.isfinite(t))
            and np.all(t > 0)):
        raise ValueError("sizes and times must be finite and > 0; drop the failed measurements")
    hops = np.ones_like(n)
    if num_devices is not None:
        k = np.broadcast_to(np.asarray(num_devices, float), n.shape)
        if np.any(k < 2) or np.any(k != np.round(k)):
            raise ValueError(f"the ring needs integer device counts >= 2, got {num_devices!r}")
        hops = 2 * (k - 1)
        n = n * 2 * (k - 1) / k
    A = np.stack([hops / t, n / t], axis=1)        # relative error: divide each row by t
    alpha, beta = np.linalg.lstsq(A, np.ones_like(t), rcond=None)[0]
    if alpha < 0:                                  # the best fit with alpha = 0
        alpha, beta = 0.0, A[:, 1].sum() / (A[:, 1] ** 2).sum()
    elif beta < 0:                                 # the best fit with beta = 0
        alpha, beta = A[:, 0].sum() / (A[:, 0] ** 2).sum(), 0.0
    return float(alpha), float(beta)


def allreduce_time(num_bytes, num_devices, alpha, beta):
    """The ring allreduce of ``num_bytes`` on ``num_devices`` devices: 2(k-1) hops of latency
    ``alpha``, each device sending 2(k-1)/k ``num_bytes`` at ``beta`` seconds per byte."""
    k = num_devices
    d2l.check_positive(num_devices=k)
    if min(num_bytes, alpha, beta) < 0:
        raise ValueError(f"num_bytes, alpha and beta must be >= 0, got {num_bytes}, {alpha}, "
                         f"{beta}")
    return 2 * (k - 1) * alpha + 2 * (k - 1) / k * num_bytes * beta


def step_cost(step, *args):
    """The FLOPs and bytes accessed of ``step(*args)`` as XLA counts them in the compiled
    program (``compiled.cost_analysis()``); ``step`` may be compiled already."""
    compiled = step if hasattr(step, "cost_analysis") else jax.jit(step).lower(*args).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    if not cost or "flops" not in cost:
        raise ValueError(f"the {jax.default_backend()} backend reports no cost analysis for "
                         f"this program; count the FLOPs by hand")
    return {"flops": float(cost["flops"]), "bytes": float(cost.get("bytes accessed", 0.0))}


def measure_compute(step, make_args, batch_sizes, repeat=5):
    """Compile ``step(*make_args(b))`` for every batch size b, and return one row per size:
    its median seconds on one device (``d2l.time_call``), FLOPs and bytes (``step_cost``).
    With the smoke switch on, only the 2 smallest sizes."""
    rows = []
    for b in sorted(batch_sizes)[:d2l.shrink(len(batch_sizes), 2)]:
        d2l.check_positive(batch_size=b)
        args = make_args(b)
        compiled = jax.jit(step).lower(*args).compile()
        rows.append(dict(batch=b, seconds=d2l.time_call(compiled, *args, repeat=repeat),
                         **step_cost(compiled)))
    return rows


def predict_step_time(compute_time, num_devices, grad_bytes, alpha, beta, overlap=False,
                      num_parallel=None):
    """Predicted seconds of one data-parallel step on ``num_devices`` devices.

    ``compute_time``: the forward and backward pass of one device's share of the batch, timed
    on one device. ``num_parallel``: how many devices can compute at once (default: all;
    simulated CPU devices share the cores: pass their number), so k devices take
    k / min(k, num_parallel) rounds. Then the ring allreduce of ``grad_bytes``
    (``allreduce_time``); with ``overlap`` it runs during the backward pass, 2/3 of the compute.
    """
    k = num_devices
    num_parallel = k if num_parallel is None else num_parallel
    d2l.check_positive(num_devices=k, num_parallel=num_parallel)
    if not (math.isfinite(compute_time) and compute_time >= 0):
        raise ValueError(f"compute_time must be seconds >= 0, got {compute_time!r}")
    compute = compute_time * k / min(k, num_parallel)
    comm = allreduce_time(grad_bytes, k, alpha, beta)
    if not overlap:
        return compute + comm
    backward = 2 / 3 * compute
    return compute - backward + max(backward, comm)
