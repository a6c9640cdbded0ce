"""The library's argument checks: one rule per kind of input, shared by every public function.

The chapter shows its functions without checks; the library wraps each shown function with
``validated(fn, check)``, so the public name refuses bad input with one line that names the
value and the fix (an ``InputError``), while ``inspect.unwrap`` gives back the shown text.
Modules use these rules as ``from . import _checks as check`` and ``check.positive(lr=lr)``.
"""
import functools
import math
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from .errors import DivergedError, InputError

F = TypeVar("F")


def validated(fn: F, check: Callable[..., object]) -> F:
    """``fn`` behind its argument check: the returned function calls ``check(*args,
    **kwargs)``, then ``fn``. The chapter shows ``fn`` as it is (``inspect.unwrap`` returns it);
    the library's public name is the checked one, so bad input still gets a clear error. For a
    class, the checked name is a subclass of the same name whose constructor checks first
    (``__wrapped__`` is the shown class; ``inspect.unwrap`` stops at classes from Python 3.12)."""
    if isinstance(fn, type):
        return _validated_class(fn, check)

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        check(*args, **kwargs)
        return fn(*args, **kwargs)
    return checked


def _validated_class(cls, check):
    class Checked(cls):
        @functools.wraps(cls.__init__)
        def __init__(self, *args, **kwargs):
            check(*args, **kwargs)
            super().__init__(*args, **kwargs)

    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(Checked, name, getattr(cls, name))
    Checked.__wrapped__ = cls  # inspect.unwrap gives back the shown class
    return Checked


def positive(**values: Any) -> None:
    """Raise an InputError naming the first value that is not a finite number > 0; names
    starting with ``num_`` or ending with ``_size`` must be integers."""
    for name, value in values.items():
        integer = name.startswith("num_") or name.endswith("_size")
        kinds = (int,) if integer else (int, float)
        ok = (isinstance(value, kinds) and not isinstance(value, bool)
              and math.isfinite(value) and value > 0)
        if not ok:
            what = "a positive integer" if integer else "a finite positive number"
            raise InputError(f"{name} must be {what}, got {value!r}")


def divisible(size: int, parts: int, what: str = "batch size", over: str = "devices") -> None:
    """Raise an InputError naming the nearest good sizes unless ``size`` splits into
    ``parts``."""
    if isinstance(parts, bool) or not isinstance(parts, int) or parts < 1:
        raise InputError(f"the number of {over} must be a positive integer, got {parts!r}")
    if size % parts:
        lower = size - size % parts
        options = " or ".join(str(s) for s in (lower, lower + parts) if s > 0)
        raise InputError(f"{what} {size} does not divide evenly over {parts} {over}; "
                         f"use a multiple of {parts}, e.g. {options}")


def labels(X: Any, y: Any, num_classes: int | None = None) -> None:
    """Raise an InputError unless ``y`` holds one label per example of ``X``, and (labels held
    in a NumPy array) each a class index from 0 (below ``num_classes`` if given): JAX takes
    an index out of range for another class without a word."""
    if len(X) != len(y):
        raise InputError(f"X has {len(X)} examples but y has {len(y)} labels; pass one "
                         f"label per example")
    if not (isinstance(y, np.ndarray) and y.size and np.issubdtype(y.dtype, np.number)):
        return
    low, high = y.min(), y.max()
    if low < 0 or (num_classes is not None and high >= num_classes):
        valid = "0 up" if num_classes is None else f"0 to {num_classes - 1}"
        raise InputError(f"y holds the label {low if low < 0 else high}, but labels are class "
                         f"indices from {valid}; JAX would take it for another class")


def spec(partition: Any, mesh: Any, shape: tuple[int, ...] | None = None) -> None:
    """Raise an InputError unless the PartitionSpec ``partition`` names only axes of ``mesh``
    and, given ``shape``, tiles it evenly."""
    for dim, entry in enumerate(partition):
        names = [n for n in (entry if isinstance(entry, tuple) else (entry,)) if n is not None]
        for name in names:
            if name not in mesh.axis_names:
                raise InputError(f"{partition} names the mesh axis {name!r}, but the mesh has "
                                 f"only the axes {tuple(mesh.axis_names)}; use one of those, or "
                                 f"build the mesh with it: d2l.device_mesh(axis_names="
                                 f"({name!r},))")
        parts = math.prod(mesh.shape[n] for n in names)
        if shape is not None and dim < len(shape):
            divisible(shape[dim], parts, f"dimension {dim} of shape {tuple(shape)}: size",
                      f"devices of the mesh axes {tuple(names)} ({partition})")


def optimizer(value: Any) -> None:
    """Raise an InputError unless ``value`` is an optax optimizer (has ``init`` and
    ``update``)."""
    if not (hasattr(value, "init") and hasattr(value, "update")):
        raise InputError(f"optimizer must be an optax optimizer such as optax.sgd(0.1), "
                         f"got {value!r}")


@functools.cache
def _finite_flags() -> Callable[[list[Any]], list[Any]]:
    import jax
    import jax.numpy as jnp
    return jax.jit(lambda arrays: [jnp.isfinite(x).all() for x in arrays])


def finite(tree: Any, what: str = "the state") -> None:
    """Raise a DivergedError naming the arrays of ``tree`` that hold NaN or infinity."""
    import jax
    import jax.numpy as jnp
    named = {jax.tree_util.keystr(path, simple=True, separator="."): x
             for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]
             if jnp.issubdtype(jnp.result_type(x), jnp.inexact)}
    bad = [k for k, ok in zip(named, _finite_flags()(list(named.values()))) if not bool(ok)]
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise DivergedError(f"{what} holds NaN or infinity in {', '.join(bad[:3])}{more}; the "
                            f"run diverged: lower the learning rate")
