"""What collectives and steps cost: time collectives, fit the alpha-beta model (notebook
07a), count and time a step's compute and predict the step time of data parallelism on k
devices (notebook 07b). The functions the notebooks show are kept as shown; their public
names check their arguments first (``check.validated``)."""
import functools
import time
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P
from jax.typing import ArrayLike

from . import _checks as check
from ._earlier import cost_model as d2l
from .errors import InputError
from .smoke_switch import shrink

COLLECTIVE_NAMES = ("psum", "all_gather", "psum_scatter", "ppermute")


# --- notebook 07a: timing collectives, bandwidths, the alpha-beta model ----------------------

def _check_collective_inputs(collective: str, num_devices: int, num_bytes: int) -> None:
    k = num_devices
    if collective not in COLLECTIVE_NAMES or not isinstance(check._number(k), int) or k < 2:
        raise InputError(f"use one of {list(COLLECTIVE_NAMES)} on num_devices >= 2, got "
                         f"{collective!r}, {k!r}")
    check.positive(num_bytes=num_bytes)
    check.divisible(num_bytes, 4 * k, "num_bytes", f"float32 blocks of {k} devices")
    check.fits(2 * num_bytes, f"num_bytes={num_bytes} (an input and an output)",
               "pass a smaller size")


def collective_loop(collective, num_devices, num_bytes):
    """(program, input, calls): a collective, repeated in a shard_map loop."""
    k = num_devices
    ops = {"psum": lambda x: lax.psum(x, "data"),
           "all_gather": lambda x: lax.all_gather(
               x, "data", tiled=True)[:x.size],
           "psum_scatter": lambda x: x.at[:x.size // k].set(
               lax.psum_scatter(x, "data", tiled=True)),
           "ppermute": lambda x: lax.ppermute(
               x, "data", [(i, (i + 1) % k) for i in range(k)])}
    calls = int(np.clip(2 ** 22 // num_bytes, 1, 32))  # <= 4 MB per program
    loop = lambda x: lax.fori_loop(0, calls, lambda i, x: ops[collective](x), x)
    mesh = jax.make_mesh((k,), ("data",), axis_types=(AxisType.Auto,))
    program = jax.jit(jax.shard_map(loop, mesh=mesh, in_specs=P("data"),
                                    out_specs=P("data"), check_vma=False))
    size = num_bytes // 4 * (1 if collective == "all_gather" else k)
    x = jax.device_put(jnp.zeros(size), NamedSharding(mesh, P("data")))
    return program, x, calls


collective_loop = check.validated(collective_loop, _check_collective_inputs)


def _check_time_collective(collective: str, num_devices: int, num_bytes: int,
                           repeat: int = 5) -> None:
    check.integer(1, repeat=repeat)
    _check_collective_inputs(collective, num_devices, num_bytes)


def time_collective(collective, num_devices, num_bytes, repeat=5):
    """Seconds per call: ``repeat`` samples, the first after compiling."""
    program, x, calls = collective_loop(collective, num_devices, num_bytes)
    return np.array([d2l.time_call(program, x, repeat=1, warmup=int(i == 0))
                     / calls for i in range(repeat)])


time_collective = check.validated(time_collective, _check_time_collective)


def _check_bus_bandwidth(collective: str, num_devices: int, num_bytes: float,
                         seconds: float) -> None:
    if collective not in COLLECTIVE_NAMES:
        raise InputError(f"unknown collective {collective!r}; use one of "
                         f"{list(COLLECTIVE_NAMES)}")
    check.positive(num_devices=num_devices, seconds=seconds)
    check.nonnegative(num_bytes=num_bytes)


def bus_bandwidth(collective, num_devices, num_bytes, seconds):
    """nccl-tests' algorithm bandwidth n/t and bus bandwidth f n/t, bytes/s."""
    k = num_devices
    f = {"psum": 2 * (k - 1) / k, "all_gather": (k - 1) / k,
         "psum_scatter": (k - 1) / k, "ppermute": 1.0}[collective]
    return num_bytes / seconds, f * num_bytes / seconds


bus_bandwidth = check.validated(bus_bandwidth, _check_bus_bandwidth)


def _check_measure_collectives(collectives: Sequence[str], device_counts: Sequence[int],
                               sizes: Sequence[int], repeat: int = 5) -> None:
    """Raise an InputError if there is nothing to measure."""
    for name, value in [("collectives", collectives), ("device_counts", device_counts),
                        ("sizes", sizes)]:
        if isinstance(value, (str, bytes)) or not np.iterable(value):
            raise InputError(f"{name} must be a list, got {value!r}; e.g. {name}=[...]")
    check.nonempty(collectives=collectives, device_counts=device_counts, sizes=sizes)
    check.integer(1, repeat=repeat)


def measure_collectives(collectives, device_counts, sizes, repeat=5):
    """Time each collective on each device count at each size: rows with the
    median, the fastest and the slowest sample, and both bandwidths."""
    rows = []
    for collective in collectives:
        for k in device_counts:
            for n in sorted(sizes):
                times = time_collective(collective, k, n, repeat)
                t = float(np.median(times))
                algbw, busbw = bus_bandwidth(collective, k, n, t)
                rows.append(dict(collective=collective, devices=k, bytes=n,
                                 seconds=t, low=times.min(), high=times.max(),
                                 algbw=algbw, busbw=busbw))
    return rows


def _smallest_sizes_in_smoke_runs(measure: Callable[..., list[dict[str, Any]]]
                                  ) -> Callable[..., list[dict[str, Any]]]:
    """``measure`` on the 5 smallest sizes with the smoke switch on, on all of them
    otherwise; ``inspect.unwrap`` gives back the shown function."""
    @functools.wraps(measure)
    def measured(collectives, device_counts, sizes, repeat=5):
        sizes = sorted(sizes)[:shrink(len(sizes), 5)]
        return measure(collectives, device_counts, sizes, repeat)
    return measured


measure_collectives = _smallest_sizes_in_smoke_runs(
    check.validated(measure_collectives, _check_measure_collectives))


def _check_alpha_beta_inputs(num_bytes: ArrayLike, seconds: ArrayLike) -> None:
    for name, values in (("num_bytes", num_bytes), ("seconds", seconds)):
        if np.asarray(values).dtype.kind not in "iuf":
            raise InputError(f"{name} must be a list of numbers, got {values!r}")
    n, t = np.asarray(num_bytes, float), np.asarray(seconds, float)
    if n.ndim != 1 or n.shape != t.shape or len(np.unique(n)) < 2 or not np.all(
            np.isfinite(n * t) & (n > 0) & (t > 0)):
        raise InputError(f"need as many times as sizes, at least two different sizes, all finite "
                         f"and > 0 (drop failed measurements); got {n.tolist()}, {t.tolist()}")


def fit_alpha_beta(num_bytes, seconds):
    """(alpha, beta) >= 0 of seconds = alpha + beta num_bytes, fitted."""
    n, t = np.asarray(num_bytes, float), np.asarray(seconds, float)
    A = np.stack([1 / t, n / t], axis=1)  # relative errors: rows over t
    alpha, beta = np.linalg.lstsq(A, np.ones_like(t), rcond=None)[0]
    if alpha < 0 or beta < 0:             # the best fit with that one 0
        column = A[:, 0] if beta < 0 else A[:, 1]
        value = column.sum() / (column ** 2).sum()
        alpha, beta = (value, 0.0) if beta < 0 else (0.0, value)
    return float(alpha), float(beta)


fit_alpha_beta = check.validated(fit_alpha_beta, _check_alpha_beta_inputs)


def _check_ring_per_hop(alpha: float, beta: float, num_devices: int) -> None:
    check.nonnegative(alpha=alpha, beta=beta)
    if not isinstance(check._number(num_devices), int) or num_devices < 2:
        raise InputError(f"a ring needs num_devices >= 2, got {num_devices!r}")


def ring_per_hop(alpha, beta, num_devices):
    """A ring allreduce's latency per hop and seconds per byte on a link."""
    k = num_devices
    return alpha / (2 * (k - 1)), beta * k / (2 * (k - 1))


ring_per_hop = check.validated(ring_per_hop, _check_ring_per_hop)


# --- notebook 07b: the compute of a step, predicting the step --------------------------------

def _check_cost_analysis(cost):
    if not cost or "flops" not in cost:
        raise InputError(f"the {jax.default_backend()} backend reports no cost analysis for "
                         f"this program; count its FLOPs by hand")


def step_cost(step, *args):
    """FLOPs and bytes accessed that XLA counts in step(*args)."""
    if not hasattr(step, "cost_analysis"):          # not compiled yet
        step = jax.jit(step).lower(*args).compile()
    cost = step.cost_analysis()
    return {"flops": cost["flops"], "bytes": cost.get("bytes accessed", 0.0)}


def _counted(fn):
    """``step_cost`` behind a check of what the backend counted: compiles once, then calls
    the shown function with the compiled step."""
    @functools.wraps(fn)
    def checked(step, *args):
        if not hasattr(step, "cost_analysis"):
            step = jax.jit(step).lower(*args).compile()
        _check_cost_analysis(step.cost_analysis())
        return fn(step)
    return checked


def _check_step_cost(step: Callable[..., Any], *args: Any) -> None:
    if not callable(step):
        raise InputError(f"step must be a function (or a compiled one), got {step!r}")


step_cost = check.validated(_counted(step_cost), _check_step_cost)


def cpu_time_call(f: Callable[..., Any], *args: Any, repeat: int = 5) -> tuple[float, float]:
    """CPU seconds (of every thread of this process) and wall-clock seconds per call of
    ``f(*args)``, means over ``repeat`` calls after one that compiles; their ratio is the number
    of cores the calls kept busy (``d2l.shrink`` keeps 2 calls in quick runs)."""
    check.integer(1, repeat=repeat)
    jax.block_until_ready(f(*args))
    repeat = shrink(repeat, 2)
    cpu, wall = time.process_time(), time.perf_counter()
    for _ in range(repeat):
        jax.block_until_ready(f(*args))
    return (time.process_time() - cpu) / repeat, (time.perf_counter() - wall) / repeat


def _check_step_time_inputs(compute_time: float, num_devices: int, grad_bytes: float,
                            alpha: float, beta: float, overlap: bool = False,
                            parallelism: float | None = None) -> None:
    check.flag(overlap=overlap)
    check.positive(num_devices=num_devices,
                   parallelism=num_devices if parallelism is None else parallelism)
    check.nonnegative(compute_time=compute_time, grad_bytes=grad_bytes, alpha=alpha, beta=beta)


def predict_step_time(compute_time, num_devices, grad_bytes, alpha, beta,
                      overlap=False, parallelism=None):
    """Seconds of a data-parallel step: k shares, a ring allreduce."""
    k = num_devices
    parallelism = k if parallelism is None else parallelism
    compute = compute_time * k / parallelism
    allreduce = 2 * (k - 1) * alpha + 2 * (k - 1) / k * grad_bytes * beta
    backward = 2 / 3 * compute if overlap else 0.0
    return compute - backward + max(backward, allreduce)


predict_step_time = check.validated(predict_step_time, _check_step_time_inputs)


# --- a recorded run on an accelerator (docs/benchmarks.md, "One device of each kind") --------

# One SGD step of LeNet and of ResNet-18 (float32) on one NVIDIA H100 and on its host's CPU as
# one JAX device, as ``python -m d2l_multi benchmark models`` printed them: the run at batch 256
# and the one with ``--batch-size 1024 --repeat 20``. GFLOP/step is XLA:CPU's count of the step.
H100_MODELS = {
    "machine": "Intel(R) Xeon(R) Processor, 16 cores, Linux 6.18.44-fc-v657-gpu",
    "versions": "python 3.12.3, jax 0.11.2, jaxlib 0.11.2, "
                "devices: 1 x NVIDIA H100 80GB HBM3",
    "columns": ("model", "device", "batch", "ms/step", "GFLOP/step"),
    "rows": [("LeNet", "cpu", 256, 46.88, 3.5),
             ("LeNet", "NVIDIA H100 80GB HBM3", 256, 0.71, 3.5),
             ("ResNet-18 (width 64)", "cpu", 256, 2133.55, 594.6),
             ("ResNet-18 (width 64)", "NVIDIA H100 80GB HBM3", 256, 8.30, 594.6),
             ("LeNet", "cpu", 1024, 175.31, 13.8),
             ("LeNet", "NVIDIA H100 80GB HBM3", 1024, 1.22, 13.8),
             ("ResNet-18 (width 64)", "cpu", 1024, 9893.13, 2378.3),
             ("ResNet-18 (width 64)", "NVIDIA H100 80GB HBM3", 1024, 23.53, 2378.3)],
}
