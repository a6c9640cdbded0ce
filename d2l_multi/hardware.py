"""Devices: simulate CPU devices, choose the devices the chapter runs on, build meshes.

Nothing here runs at import time: JAX's backend starts only when a function is called, so a
reader can import ``d2l_multi`` and still choose how many devices to simulate.
"""
import math
import os
from collections.abc import MutableMapping, Sequence
from typing import Any

import numpy as np

from . import _checks as check
from .errors import InputError

_choice = None  # (devices, reason), decided once per process by ``devices()``
_machine_said = False  # ``simulate_devices`` names the machine once per process


def _jax():
    import jax
    return jax


def simulate_devices(n: int = 8) -> list[Any]:
    """Make JAX expose ``n`` CPU devices; call before any JAX computation.

    Accelerators are never hidden. Returns the devices the chapter will use (``devices()``):
    the accelerators when there are at least ``max(2, n)``, otherwise the ``n`` CPU devices.
    """
    check.integer(1, n=n)
    jax = _jax()
    try:
        jax.config.update("jax_num_cpu_devices", n)
        size_cpu_thread_pool(n)  # the backend has not started: its thread pool can be sized
        set_cpu_compiler_flags()  # ... and XLA reads its flags when it starts
    except RuntimeError:
        have = len(jax.devices("cpu"))
        if have != n:
            raise RuntimeError(
                f"JAX has already started with {have} CPU device(s), so it cannot switch to "
                f"{n} now. Restart the kernel (or Python process) and call "
                f"d2l_multi.simulate_devices({n}) before any other JAX code runs "
                f"(or set JAX_NUM_CPU_DEVICES={n} before starting Python).") from None
    _say_machine()
    return devices()


def _say_machine():
    """Print ``machine_line`` once per process: a notebook's first output says what its
    outputs were computed on."""
    global _machine_said
    if not _machine_said:
        _machine_said = True
        print(machine_line(_accelerators()))


def size_cpu_thread_pool(n: int, environ: MutableMapping[str, str] | None = None) -> None:
    """Give XLA:CPU's thread pool at least ``2 n`` threads (``PJRT_NPROC``) for ``n`` devices.

    XLA:CPU launches and runs multi-device steps on one pool of max(cores, n) threads. Once 32
    steps are queued on a device, a launch blocks while holding a pool thread, so the n
    executions of a collective cannot all run and the program deadlocks ("Termination timeout
    for all reduce"). At most n launches block at once, so 2 n threads always suffice. XLA
    reads ``PJRT_NPROC`` when the CPU backend starts; a larger value already set is kept.
    """
    env = os.environ if environ is None else environ
    if cpu_threads(env) < 2 * n:
        env["PJRT_NPROC"] = str(2 * n)


def cpu_threads(environ: MutableMapping[str, str] | None = None) -> int:
    """The threads XLA:CPU's pool starts with: ``PJRT_NPROC`` (or ``NPROC``), else the cores
    this process may use; the pool holds at least one thread per simulated device."""
    env = os.environ if environ is None else environ
    current = env.get("PJRT_NPROC") or env.get("NPROC") or ""
    if current.strip().isdigit():
        return int(current)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


CPU_COMPILER_FLAGS = ("--xla_cpu_experimental_ynn_fusion_type=",)
_FLAGGED_JAXLIB = ((0, 10), (0, 12))  # versions whose XLA has these flags (0.10.2 measured)


def set_cpu_compiler_flags(environ: MutableMapping[str, str] | None = None,
                           jaxlib_version: str | None = None) -> list[str]:
    """Add ``CPU_COMPILER_FLAGS`` to ``XLA_FLAGS``, so XLA:CPU computes convolutions itself.

    By default XLA:CPU (jaxlib 0.10-0.11) hands convolutions, matrix products and some
    elementwise and pooling fusions to the YNNPACK library; its kernel-gradient convolution
    takes most of LeNet's step, several times XLA's own convolution. The flag turns YNNPACK
    off. XLA reads ``XLA_FLAGS`` once, when its first backend starts; a flag already named
    there is kept, and other jaxlib versions (which may not know it: an unknown flag stops the
    process) are left alone. Returns the flags added.
    """
    env = os.environ if environ is None else environ
    if jaxlib_version is None:
        from importlib import metadata
        jaxlib_version = metadata.version("jaxlib")
    try:
        version = tuple(int(part) for part in jaxlib_version.split(".")[:2])
    except ValueError:  # e.g. a development build
        return []
    if not _FLAGGED_JAXLIB[0] <= version < _FLAGGED_JAXLIB[1]:
        return []
    current = env.get("XLA_FLAGS", "")
    added = [flag for flag in CPU_COMPILER_FLAGS if flag.split("=")[0] not in current]
    if added:
        env["XLA_FLAGS"] = " ".join([current, *added]).strip()
    return added


def choose_devices(accelerators: Sequence[Any], cpus: Sequence[Any]) -> tuple[list[Any], str]:
    """The devices the chapter runs on, and why: the accelerators when there are at least two
    and at least as many as the simulated CPU devices (a notebook written for 8 devices needs
    8); otherwise the CPU devices, so that "N devices" means more than one."""
    accelerators, cpus = list(accelerators), list(cpus)
    if len(accelerators) >= max(2, len(cpus)):
        return accelerators, f"{len(accelerators)} {accelerators[0].platform.upper()} devices"
    n = len(cpus)
    if not accelerators:
        return cpus, f"{n} CPU devices (no accelerator found)"
    kind, k = accelerators[0].platform, len(accelerators)
    why = (f"with a single {kind.upper()} there is nothing to split over" if k == 1 else
           f"{k} {kind.upper()}s are fewer than the {n} devices asked for")
    where = f"jax.devices({kind!r})" + ("[0]" if k == 1 else "")
    return cpus, (f"{n} simulated CPU device{'s' * (n != 1)}: {why}, so the CPU is JAX's default "
                  f"backend (jax.devices() and jax.make_mesh use the CPU devices); the "
                  f"{kind.upper()}{'s stay' if k > 1 else ' stays'} available as {where}")


def _accelerators():
    """Every device that is not a CPU, whichever backend is JAX's default. An InputError
    when ``JAX_PLATFORMS`` names a platform JAX cannot start here."""
    jax = _jax()
    from jax.extend import backend
    try:
        return [d for name in backend.backends() if name != "cpu" for d in jax.devices(name)]
    except (RuntimeError, AssertionError) as e:  # JAX says 'assert' for an unknown plugin
        asked = os.environ.get("JAX_PLATFORMS", "").strip()
        if not asked:
            raise
        why = str(e).split(" (set JAX_PLATFORMS")[0] or "no backend of that name starts"
        raise InputError(f"JAX_PLATFORMS={asked!r} names a platform this machine lacks "
                         f"({why}); set it to one of {_platforms()}, or unset it to let JAX "
                         f"choose") from None


def _platforms():
    """The platforms JAX can start here at most: the CPU and those of installed plugins."""
    import importlib.metadata
    import importlib.util
    names = {"cpu"} | {kind for ep in importlib.metadata.entry_points(group="jax_plugins")
                       for kind in ("cuda", "rocm") if kind in ep.name}
    return sorted(names | ({"tpu"} if importlib.util.find_spec("libtpu") else set()))


def _cpu_first():
    """Restart JAX's backends with the CPU as the default one, the accelerators after it.

    Only before any array exists (restarting would invalidate it); returns whether it did.
    """
    jax = _jax()
    from jax.extend import backend
    if jax.live_arrays():
        return False
    others = [name for name in backend.backends() if name != "cpu"]
    backend.clear_backends()
    jax.config.update("jax_platforms", ",".join(["cpu", *others]))
    return True


def _chosen():
    global _choice
    if _choice is None:
        jax = _jax()
        accelerators = _accelerators()
        chosen, reason = choose_devices(accelerators, jax.devices("cpu"))
        if accelerators and chosen[0].platform == "cpu":
            if _cpu_first():
                chosen = jax.devices("cpu")    # the devices of the restarted backend
            else:                              # arrays exist: keep them, move the default
                jax.config.update("jax_default_device", chosen[0])
        _choice = chosen, reason
        print(f"d2l_multi: using {reason}")
    return _choice[0]


def num_gpus() -> int:
    """Return the number of accelerators (GPUs or TPUs); 0 on a CPU-only machine."""
    return len(_accelerators())


def try_all_gpus() -> list[Any]:
    """Return the devices the chapter uses (``devices()``); never ``[]``, unlike d2l's."""
    return devices()


def try_gpu(i: int = 0) -> Any:
    """Return device ``i`` of ``devices()`` if it exists, else the first CPU device."""
    check.integer(0, i=i)
    devs = devices()
    return devs[i] if i < len(devs) else _jax().devices("cpu")[0]


def devices(n: int | None = None) -> list[Any]:
    """Return the first ``n`` devices the chapter uses (all when ``n`` is None).

    Those are the accelerators when there are at least two and no fewer than the simulated
    CPU devices, otherwise the CPU devices (``simulate_devices``); the choice is made, and
    printed, once.
    """
    devs = _chosen()
    if n is None:
        return list(devs)
    check.integer(1, **{"the number of devices": n})
    if n > len(devs):
        kind = devs[0].platform.upper()
        hint = (f"Simulate more CPU devices: restart Python and call "
                f"d2l_multi.simulate_devices({n}) first (or set JAX_NUM_CPU_DEVICES={n})."
                if kind == "CPU" else "Use at most that many.")
        raise InputError(f"asked for {n} devices but JAX sees only {len(devs)} {kind} "
                         f"device(s). {hint}")
    return list(devs[:n])


_first_devices = devices  # device_mesh's argument ``devices`` hides the function


def cpu_model() -> str:
    """The CPU's model name ('AMD EPYC 7B13'), else the machine type ('x86_64')."""
    import platform
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    return cpu


def versions() -> str:
    """'python 3.11.7, jax 0.10.2, ...': the versions that decide what the notebooks compute
    (those installed of jax, jaxlib, flax, optax, orbax-checkpoint, grain, keras)."""
    import platform
    from importlib import metadata
    found = [f"python {platform.python_version()}"]
    for name in ("jax", "jaxlib", "flax", "optax", "orbax-checkpoint", "grain", "keras"):
        try:
            found.append(f"{name} {metadata.version(name)}")
        except metadata.PackageNotFoundError:
            pass
    return ", ".join(found)


def machine_line(accelerators: Sequence[Any] = ()) -> str:
    """'d2l_multi: AMD EPYC 7B13, 2 cores; python 3.11.7, jax 0.10.2, ...' in lines of at
    most 88 characters (two on most machines): the CPU, the cores this process may use, the
    ``accelerators`` (devices with a ``device_kind``) and the versions, never splitting a
    name from its version."""
    import textwrap
    kinds = {}
    for device in accelerators:
        kinds[device.device_kind] = kinds.get(device.device_kind, 0) + 1
    found = "".join(f", {count} x {kind}" for kind, count in kinds.items())
    text = (f"d2l_multi: {cpu_model()}, {cpu_threads({})} cores{found}; "
            + versions().replace(" ", "\u00a0").replace(",\u00a0", ", "))
    return textwrap.fill(text, 88, subsequent_indent="  ", break_long_words=False,
                         break_on_hyphens=False).replace("\u00a0", " ")


def describe(devs: Sequence[Any]) -> str:
    """A short human label for a list of devices, e.g. ``'8 cpu devices'``."""
    check.devices(devs, "devs")
    kinds = sorted({d.platform for d in devs})
    return f"{len(devs)} {'/'.join(kinds)} device{'s' if len(devs) != 1 else ''}"


def device_mesh(shape: Sequence[int] = (-1,), axis_names: Sequence[str] | None = None,
                devices: Sequence[Any] | None = None) -> Any:
    """A mesh with Auto axes over ``devices`` (default: the first ones of ``d2l.devices()``).

    One size in ``shape`` may be -1, meaning 'the remaining devices': ``(-1,)`` is a 1-D mesh
    over all devices, ``(2, -1)`` on 8 devices is (2, 4); ``(4,)`` uses the first 4. The axes
    are named ``('data',)`` or ``('data', 'model')`` unless ``axis_names`` says otherwise.
    """
    jax = _jax()
    shape = (shape,) if check._number(shape) is not None else tuple(shape)
    if axis_names is None:
        axis_names = ("data", "model")[:len(shape)] if len(shape) <= 2 else ()
    if isinstance(axis_names, str) or len(set(axis_names)) != len(axis_names) or \
            not all(isinstance(a, str) and a for a in axis_names):
        raise InputError(f"axis_names={axis_names!r}: pass one distinct name per axis, "
                         f"e.g. ('data',) or ('data', 'model')")
    axis_names = tuple(axis_names)
    if len(shape) != len(axis_names):
        raise InputError(f"mesh shape {shape} has {len(shape)} axes but axis_names "
                         f"{axis_names} has {len(axis_names)}; give one size per name")
    if any(not isinstance(check._number(s), int) or (s < 1 and s != -1)
           for s in shape) or shape.count(-1) > 1:
        raise InputError(f"mesh shape {shape}: sizes must be positive integers, with at most "
                         f"one -1 (the remaining devices), e.g. (8,) or (2, -1)")
    shape = tuple(int(s) for s in shape)
    if devices is None:
        devices = _first_devices(None if -1 in shape else math.prod(shape))
    check.devices(devices)
    devices = list(np.ravel(np.asarray(devices, dtype=object)))  # a grid of them too
    n, known = len(devices), math.prod(s for s in shape if s != -1)
    if -1 in shape and n % known == 0:
        shape = tuple(n // known if s == -1 else s for s in shape)
    if -1 in shape or math.prod(shape) != n:
        need = f"a multiple of {known}" if -1 in shape else math.prod(shape)
        examples = ", ".join(str((a, n // a)) for a in range(1, n + 1) if n % a == 0)
        raise InputError(
            f"a mesh of shape {shape} needs {need} devices but there are {n}; choose axis "
            f"sizes whose product is {n}, e.g. {examples}, or write -1 for one axis to give "
            f"it the remaining devices, e.g. (2, -1)")
    auto = jax.sharding.AxisType.Auto
    return jax.make_mesh(shape, axis_names, axis_types=(auto,) * len(shape), devices=devices)
