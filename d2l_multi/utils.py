"""d2l's small helpers (Timer, Accumulator) and a few checks and measurements used throughout."""
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from . import _checks as check
from .errors import InputError


class Timer:
    """Record multiple running times."""

    def __init__(self) -> None:
        self.times: list[float] = []
        self.start()

    def start(self) -> None:
        """Start the timer."""
        self.tik = time.perf_counter()

    def stop(self) -> float:
        """Stop the timer and record the time in a list."""
        self.times.append(time.perf_counter() - self.tik)
        return self.times[-1]

    def avg(self) -> float:
        """Return the average time."""
        if not self.times:
            raise InputError("the timer has recorded no time yet: call stop() first")
        return sum(self.times) / len(self.times)

    def sum(self) -> float:
        """Return the sum of time."""
        return sum(self.times)

    def cumsum(self) -> list[float]:
        """Return the accumulated time."""
        return np.array(self.times).cumsum().tolist()


class Accumulator:
    """For accumulating sums over ``n`` variables."""

    def __init__(self, n: int) -> None:
        check.integer(1, n=n)
        self.data = [0.0] * n

    def add(self, *args: float) -> None:
        if len(args) != len(self.data):
            raise InputError(f"add takes {len(self.data)} values (one per sum), got "
                             f"{len(args)}")
        self.data = [a + float(b) for a, b in zip(self.data, args)]

    def reset(self) -> None:
        self.data = [0.0] * len(self.data)

    def __getitem__(self, idx: int) -> float:
        return self.data[idx]


def max_difference(a: Any, b: Any) -> float:
    """The largest absolute difference between matching arrays of two pytrees, as a float.
    Matching arrays have one shape, or one of them stacks copies along a leading axis (one per
    device, as ``pmap`` keeps them) and every copy is compared; nothing else is broadcast."""
    import jax

    def difference(path, x, y):
        x, y = np.asarray(x), np.asarray(y)
        where = jax.tree_util.keystr(path) or "the root"
        if x.dtype.kind not in "biufc" or y.dtype.kind not in "biufc":
            raise InputError(f"max_difference: {where} holds {x.dtype} and {y.dtype} values; "
                             f"compare numbers")
        if x.shape != y.shape and x.shape[1:] != y.shape and x.shape != y.shape[1:]:
            raise InputError(f"max_difference: shapes {x.shape} and {y.shape} differ at "
                             f"{where}; compare arrays of one "
                             f"shape, or a stack of copies (leading axis) with one copy")
        if x.dtype.kind in "biu" and y.dtype.kind in "biu":  # exactly, as Python integers
            x, y = x.astype(object), y.astype(object)
        elif x.dtype.kind != "c" and y.dtype.kind != "c":
            x, y = x.astype(np.float64), y.astype(np.float64)
        return float(np.max(np.abs(x - y), initial=0.0))
    if jax.tree.structure(a) != jax.tree.structure(b):
        raise InputError(f"max_difference: the trees differ in structure, "
                         f"{jax.tree.structure(a)} vs {jax.tree.structure(b)}; compare "
                         f"two pytrees of one structure")
    if not jax.tree.leaves(a):
        raise InputError(f"max_difference: {a!r} and {b!r} hold no arrays; nothing to compare")
    return max(jax.tree.leaves(jax.tree.map_with_path(difference, a, b)))


def time_call(f: Callable[..., Any], *args: Any, repeat: int = 5, warmup: int = 1) -> float:
    """Median wall-clock seconds of ``f(*args)`` over ``repeat`` calls, each waited for
    (``jax.block_until_ready``), after ``warmup`` untimed calls (compilation). With the smoke
    switch on, at most 2 calls are timed."""
    import jax

    from .smoke_switch import shrink
    if not callable(f):
        raise InputError(f"f must be the function to time, got {f!r}")
    check.integer(1, repeat=repeat)
    check.integer(0, warmup=warmup)
    repeat = shrink(repeat, 2)
    for _ in range(warmup):
        jax.block_until_ready(f(*args))
    timer = Timer()
    for _ in range(repeat):
        timer.start()
        jax.block_until_ready(f(*args))
        timer.stop()
    return float(np.median(timer.times))
