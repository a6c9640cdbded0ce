"""The library's argument checks: one rule per kind of input, shared by every public function.

The chapter shows its functions without checks; the library wraps each shown function with
``validated(fn, check)``, so the public name refuses bad input with one line that names the
argument, the bad value and the fix, while ``inspect.unwrap`` gives back the shown text. The
public name takes its parameter types from the (annotated) check. Modules use the rules as
``from . import _checks as check``, e.g. ``check.positive(lr=lr)``. The rules, by kind:

* numbers (``positive``, ``integer``, ``nonnegative``): Python and NumPy ints and floats (and
  0-d arrays) where a number is meant; bools refused; finite where it must be.
* labels (``labels``, ``examples``): a NumPy or JAX array or a list, one integer class index
  per example, each in [0, classes); one-hot labels named as such; no empty batch.
* arrays (``images``, ``finite_values``): images NHWC (NCHW named as such); NaN or infinity
  named with its position where it would silently mislead. Traced values (inside ``jit``)
  are checked for shape only.
* sizes (``fits``): what allocates from an argument estimates the bytes first and refuses
  what the machine cannot hold (a ``TooLargeError``, with the figure).
* empty inputs (``nonempty``, ``tree``, ``devices``): refused with a line, never a
  ``ZeroDivisionError``; devices listed twice refused too.
* files (``regular_files``): only regular files are read: a FIFO, a device or a socket would
  block a read forever. Errors name the path (``PathError`` and its kinds).
* environment variables (``env_flag``, ``env_folder``): parsed strictly; an unknown value is
  refused with the accepted ones listed.

Every rule raises an ``InputError`` (a ValueError and a TypeError) unless it says otherwise.
"""
import functools
import inspect
import math
import numbers
import os
import pathlib
import stat
import sys
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar, overload

import numpy as np

from .errors import (
    DivergedError,
    InputError,
    NotAFolderError,
    NotFoundError,
    PathError,
    TooLargeError,
)

P = ParamSpec("P")
R = TypeVar("R")
T = TypeVar("T")


@overload
def validated(fn: type[T], check: Callable[..., object]) -> type[T]: ...
@overload
def validated(fn: Callable[..., R], check: Callable[P, object]) -> Callable[P, R]: ...
def validated(fn, check):
    """``fn`` behind its argument check: the returned function calls ``check(*args,
    **kwargs)``, then ``fn``, and has the check's signature and annotations (the shown ``fn``
    has none). The chapter shows ``fn`` as it is (``inspect.unwrap`` returns it). For a class,
    the checked name is a subclass of the same name whose constructor checks first
    (``__wrapped__`` is the shown class; ``inspect.unwrap`` stops at classes from 3.12)."""
    signature = inspect.signature(check)
    if isinstance(fn, type):
        return _validated_class(fn, check, signature)

    @functools.wraps(fn)
    def checked(*args, **kwargs):
        check(*args, **kwargs)
        return fn(*args, **kwargs)
    checked.__signature__ = signature.replace(return_annotation=inspect.Signature.empty)
    checked.__annotations__ = {k: v for k, v in check.__annotations__.items() if k != "return"}
    for name in ("lower", "trace", "eval_shape"):  # a jitted fn's ahead-of-time API, unchecked
        if hasattr(fn, name):
            setattr(checked, name, getattr(fn, name))
    return checked


def _validated_class(cls, check, signature):
    class Checked(cls):
        @functools.wraps(cls.__init__)
        def __init__(self, *args, **kwargs):
            check(*args, **kwargs)
            super().__init__(*args, **kwargs)

    for name in ("__module__", "__name__", "__qualname__", "__doc__"):
        setattr(Checked, name, getattr(cls, name))
    Checked.__wrapped__ = cls  # inspect.unwrap gives back the shown class
    Checked.__signature__ = signature.replace(return_annotation=inspect.Signature.empty)
    return Checked


# ----- numbers -----

def _is_tracer(x: Any) -> bool:
    """Whether ``x`` is a value JAX is tracing (inside ``jit``, ``pmap``...): no values yet."""
    jax = sys.modules.get("jax")
    return jax is not None and isinstance(x, jax.core.Tracer)


def _values(x: Any) -> np.ndarray | None:
    """``x``'s values as a NumPy array, or None for a traced or abstract value (inside
    ``jit``; a ``jax.ShapeDtypeStruct``) or one this process holds only part of."""
    jax = sys.modules.get("jax")
    if _is_tracer(x) or not getattr(x, "is_fully_addressable", True) or (
            jax is not None and isinstance(x, jax.ShapeDtypeStruct)):
        return None
    return np.asarray(x)


def _number(value: Any) -> int | float | None:
    """``value`` as a Python int or float if it is a real number (Python, NumPy or a 0-d
    array; not a bool), else None."""
    if isinstance(value, (bool, np.bool_)) or _is_tracer(value):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    kind = getattr(getattr(value, "dtype", None), "kind", None)
    if np.ndim(value) == 0 and kind in ("i", "u", "f"):
        return int(value) if kind in "iu" else float(value)
    return None


def integer(low: int = 0, high: int | None = None, /, *, none: bool = False,
            **values: Any) -> None:
    """Raise an InputError naming the first value that is not a whole number from ``low``
    (to ``high`` if given); ``none=True`` also lets None pass."""
    for name, value in values.items():
        if (value is None and none) or _is_tracer(value):
            continue
        n = _number(value)
        if isinstance(n, int) and n >= low and (high is None or n <= high):
            continue
        what = (f"an integer from {low} to {high}" if high is not None else
                "a positive integer" if low == 1 else "a non-negative integer" if low == 0
                else f"an integer >= {low}")
        raise InputError(f"{name} must be {what}{' or None' if none else ''}, got {value!r}")


def positive(**values: Any) -> None:
    """Raise an InputError naming the first value that is not a finite number > 0; names
    starting with ``num_`` or ending with ``_size`` must be integers."""
    for name, value in values.items():
        if name.startswith("num_") or name.endswith("_size"):
            integer(1, **{name: value})
            continue
        n = _number(value)
        if _is_tracer(value):
            continue
        if n is None or not math.isfinite(n) or n <= 0:
            raise InputError(f"{name} must be a finite positive number, got {value!r}")


def nonnegative(**values: Any) -> None:
    """Raise an InputError naming the first value that is not a finite number >= 0."""
    for name, value in values.items():
        n = _number(value)
        if _is_tracer(value):
            continue
        if n is None or not math.isfinite(n) or n < 0:
            raise InputError(f"{name} must be a finite number >= 0, got {value!r}")


def flag(**values: Any) -> None:
    """Raise an InputError naming the first value that is not True or False (a NumPy bool
    counts): a string such as 'no' is truthy, so it would silently mean True."""
    for name, value in values.items():
        if not isinstance(value, (bool, np.bool_)) and not _is_tracer(value):
            raise InputError(f"{name} must be True or False, got {value!r}")


def folder_path(value: Any, name: str) -> pathlib.Path:
    """``value`` as a path; an InputError unless it is a non-empty str or os.PathLike without
    a NUL character, a NotAFolderError when it names a file."""
    if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)) or \
            not str(value) or "\0" in str(value):
        raise InputError(f"{name} must be a folder path (str or pathlib.Path), got {value!r}")
    if pathlib.Path(value).expanduser().is_file():
        raise NotAFolderError(f"{name}={value} is a file, not a folder; pass a folder")
    return pathlib.Path(value).expanduser()


def divisible(size: int, parts: int, what: str = "batch size", over: str = "devices") -> None:
    """Raise an InputError naming the nearest good sizes unless ``size`` splits into
    ``parts``."""
    integer(1, **{f"the number of {over}": parts})
    integer(0, **{what: size})
    if size % parts:
        lower = size - size % parts
        options = " or ".join(str(s) for s in (lower, lower + parts) if s > 0)
        raise InputError(f"{what} {size} does not divide evenly over {parts} {over}; "
                         f"use a multiple of {parts}, e.g. {options}")


# ----- labels and batches -----

def examples(X: Any, y: Any, names: tuple[str, str] = ("X", "y")) -> None:
    """Raise an InputError unless ``X`` and ``y`` hold as many examples, at least one."""
    n, m = (np.shape(a)[0] if np.ndim(a) else 0 for a in (X, y))
    if n != m:
        raise InputError(f"{names[0]} has {n} examples but {names[1]} has {m} labels; pass "
                         f"one label per example")
    if n == 0:
        raise InputError(f"{names[0]} is an empty batch (0 examples); pass at least one")


def labels(y: Any, num_classes: int | None = None, name: str = "y", stacked: int = 0) -> None:
    """Raise an InputError unless ``y`` (a NumPy or JAX array or a list) holds one integer
    class index per example, each from 0 (below ``num_classes`` if given): JAX takes an
    index out of range for another class, or for none, without a word. ``stacked``: leading
    axes before the batch's (one batch per device)."""
    shape = np.shape(y)[stacked:]
    if len(shape) == 2 and shape[1] > 1 and (num_classes is None or shape[1] == num_classes):
        raise InputError(f"{name} looks one-hot (shape {shape}): pass class indices, "
                         f"{name}.argmax(1)")
    if len(shape) != 1:
        raise InputError(f"{name} must hold one class index per example (shape (batch,)), "
                         f"got shape {shape}")
    if not shape[0]:
        raise InputError(f"{name} is empty (0 labels); pass at least one example")
    values = _values(y)
    if values is None:
        return  # no values to look at here
    values = values.ravel()
    if values.dtype.kind not in "iu":
        raise InputError(f"{name} holds {values.dtype} values, not class indices; pass "
                         f"integers, e.g. {name}.astype(np.int32)")
    low, high = values.min(), values.max()
    if low < 0 or (num_classes is not None and high >= num_classes):
        bad = low if low < 0 else high
        valid = "0 up" if num_classes is None else f"0 to {num_classes - 1}"
        raise InputError(f"{name} holds the label {bad}, but labels are class indices from "
                         f"{valid}; JAX would silently count it as another class or none "
                         f"(first at index {int(np.argmax(values == bad))})")


# ----- arrays -----

def images(X: Any, channels: int | None = None, name: str = "X", stacked: int = 0) -> None:
    """Raise an InputError unless ``X`` is a batch of NHWC images (batch, height, width,
    channels), with ``channels`` channels if given; NCHW is named as such. ``stacked``:
    leading axes before the batch's (one batch per device)."""
    shape = tuple(np.shape(X))[stacked:]
    if len(shape) != 4:
        raise InputError(f"{name} has shape {shape}, but a batch of images is 4-D: (batch, "
                         f"height, width, channels); add the channel axis, e.g. X[..., None]")
    if shape[1] in (1, 3) and shape[3] not in (1, 3) and (shape[1] == channels or
                                                          shape[2] == shape[3]):
        raise InputError(f"{name} has shape {shape}, which looks NCHW; the chapter's images "
                         f"are NHWC (batch, height, width, channels): "
                         f"{name}.transpose(0, 2, 3, 1)")
    if channels is not None and shape[3] != channels:
        raise InputError(f"{name} has {shape[3]} channels (shape {shape}), but the model "
                         f"takes {channels}; pass images of {channels} channel(s)")


def finite_values(X: Any, name: str = "X") -> None:
    """Raise an InputError naming the first NaN or infinity in the array ``X`` and where it
    is: fed to a model it makes every output NaN, which looks like divergence."""
    values = _values(X)
    if values is None or values.dtype.kind not in "fc":
        return
    bad = ~np.isfinite(values)
    if bad.any():
        where = tuple(int(i) for i in np.argwhere(bad)[0])
        what = "NaN" if np.isnan(values[where]) else "infinity"
        raise InputError(f"{name} holds {what} at {where}; replace it (np.nan_to_num) or "
                         f"drop that example: a model fed it computes NaN, not a result")


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


def mesh(value: Any, name: str = "mesh") -> None:
    """Raise an InputError unless ``value`` is a ``jax.sharding.Mesh``."""
    from jax.sharding import Mesh
    if not isinstance(value, Mesh):
        raise InputError(f"{name} must be a jax.sharding.Mesh, e.g. d2l.device_mesh((4, 2)), "
                         f"got {type(value).__name__}")


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


# ----- sizes -----

def available_memory() -> int | None:
    """Bytes of memory this process can still allocate (the system's available memory, or
    less under a cgroup limit), or None where it cannot be told."""
    free = None
    try:
        with open("/proc/meminfo") as f:
            free = next(int(line.split()[1]) * 1024 for line in f
                        if line.startswith("MemAvailable:"))
    except (OSError, StopIteration, ValueError):
        try:
            free = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (AttributeError, ValueError, OSError):
            pass
    try:  # a container's limit (cgroup v2)
        limit, used = (pathlib.Path("/sys/fs/cgroup", f).read_text().strip()
                       for f in ("memory.max", "memory.current"))
        free = min(free or math.inf, int(limit) - int(used)) if limit != "max" else free
    except (OSError, ValueError):
        pass
    return free


def gigabytes(num_bytes: float) -> str:
    return f"{num_bytes / 1e9:,.1f} GB"


def fits(num_bytes: float, what: str, fix: str) -> None:
    """Raise a TooLargeError (a MemoryError) if ``what`` needs more than the available
    memory: ``'{what} needs 12.0 GB, ...; {fix}'``."""
    free = available_memory()
    if free is not None and num_bytes > free:
        raise TooLargeError(f"{what} needs {gigabytes(num_bytes)}, more than the "
                            f"{gigabytes(free)} of memory available; {fix}")


# ----- empty inputs and devices -----

def nonempty(**values: Any) -> None:
    """Raise an InputError naming the first value that holds nothing (len 0)."""
    for name, value in values.items():
        if len(value) == 0:
            raise InputError(f"{name} is empty ({value!r}); pass at least one item")


def some_batches(evaluate: Callable[P, R]) -> Callable[P, R]:
    """``evaluate`` (an evaluation over ``data_iter``) raising an InputError, not a
    ZeroDivisionError, when ``data_iter`` yields no batch."""
    @functools.wraps(evaluate)
    def counted(*args, **kwargs):
        try:
            return evaluate(*args, **kwargs)
        except ZeroDivisionError:
            raise InputError("data_iter yielded no batches; pass a loader with at least one "
                             "example, e.g. data.get_dataloader(train=False)") from None
    return counted


def tree(value: Any, name: str = "params") -> None:
    """Raise an InputError unless the pytree ``value`` holds at least one array."""
    import jax
    if not jax.tree.leaves(value):
        raise InputError(f"{name} holds no arrays ({value!r}); pass a pytree of arrays, e.g. "
                         f"d2l.init_lenet_params(jax.random.key(0))")


def devices(value: Any, name: str = "devices") -> None:
    """Raise an InputError unless ``value`` lists at least one JAX device, each once."""
    listed = list(np.ravel(np.asarray(value, dtype=object))) if value is not None else []
    if not listed:
        raise InputError(f"{name} is empty: pass at least one device, e.g. d2l.devices(8)")
    seen = set()
    for d in listed:
        if not (hasattr(d, "platform") and hasattr(d, "id")):
            raise InputError(f"{name} must hold JAX devices (d2l.devices(), jax.devices()), "
                             f"got {d!r}")
        if d in seen:
            raise InputError(f"{name} lists {d} twice; each device holds one copy: pass "
                             f"distinct devices, e.g. d2l.devices({len(listed)})")
        seen.add(d)


# ----- files -----

_SPECIAL = {stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device",
            stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


def regular_files(path: str | os.PathLike,
                  fix: str = "replace it with the file it should be") -> None:
    """Raise a PathError naming the first entry of ``path`` (a file, or a folder walked
    through) that is neither a regular file nor a folder: reading a FIFO, a device or a
    socket can wait forever, and Ctrl-C with it."""
    found = [os.fspath(path)]
    if os.path.isdir(path):
        for root, dirs, files in os.walk(path):
            found += [os.path.join(root, name) for name in dirs + files]
    for p in found:
        try:
            kind = stat.S_IFMT(os.stat(p).st_mode)
        except OSError as e:
            raise PathError(f"cannot read {p}: {e.strerror}") from None
        if kind in _SPECIAL:
            raise PathError(f"{p} is {_SPECIAL[kind]}, not a regular file: reading it could "
                            f"wait forever; {fix}")


# ----- environment variables -----

_SWITCH = {"1": True, "true": True, "yes": True, "on": True,
           "0": False, "false": False, "no": False, "off": False, "": False}


def env_flag(name: str, environ: Any = None) -> bool:
    """The on/off switch in environment variable ``name`` (unset: off); an InputError for
    anything but 1/0, true/false, yes/no, on/off (any case) or empty."""
    text = (os.environ if environ is None else environ).get(name, "")
    if text.strip().lower() not in _SWITCH:
        raise InputError(f"{name}={text!r} is not a switch; set it to one of 1, 0, true, "
                         f"false, yes, no, on, off (or leave it empty for off)")
    return _SWITCH[text.strip().lower()]


def env_folder(name: str, environ: Any = None) -> pathlib.Path | None:
    """The folder that environment variable ``name`` names (None when unset or empty); a
    NotFoundError or NotAFolderError when it is no folder, never silently another."""
    text = (os.environ if environ is None else environ).get(name, "")
    if not text.strip():
        return None
    folder = pathlib.Path(text).expanduser()
    if not folder.exists():
        raise NotFoundError(f"{name}={text} does not exist; point it at an existing folder, "
                            f"or unset it")
    if not folder.is_dir():
        raise NotAFolderError(f"{name}={text} is a file, not a folder; point it at a folder, "
                              f"or unset it")
    return folder
