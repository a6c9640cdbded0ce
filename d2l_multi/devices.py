"""Devices: simulate CPU devices, list accelerators, pick the first ``n``.

Nothing here runs at import time: JAX's backend starts only when a function is called, so a
reader can import ``d2l_multi`` and still choose how many devices to simulate.
"""


def _jax():
    import jax
    return jax


def simulate_devices(n=8):
    """Make JAX expose ``n`` CPU devices; call before any JAX computation.

    Accelerators are never hidden: on a GPU/TPU machine ``jax.devices()`` still returns them
    and the ``n`` CPU devices are only used when asked for with ``jax.devices('cpu')``.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"simulate_devices needs a positive integer, got {n!r}")
    jax = _jax()
    try:
        jax.config.update("jax_num_cpu_devices", n)
    except RuntimeError:
        have = len(jax.devices("cpu"))
        if have != n:
            raise RuntimeError(
                f"JAX has already started with {have} CPU device(s), so it cannot switch to "
                f"{n} now. Restart the kernel (or Python process) and call "
                f"d2l_multi.simulate_devices({n}) before any other JAX code runs "
                f"(or set JAX_NUM_CPU_DEVICES={n} before starting Python).") from None
    return jax.devices()


def num_gpus():
    """Return the number of accelerators (GPUs or TPUs); 0 on a CPU-only machine."""
    return len([d for d in _jax().devices() if d.platform != "cpu"])


def try_all_gpus():
    """Return all accelerators, or all CPU devices when there is none (never ``[]``)."""
    return list(_jax().devices())


def try_gpu(i=0):
    """Return accelerator ``i`` if it exists, else the first CPU device."""
    devs = try_all_gpus()
    if i < len(devs) and devs[i].platform != "cpu":
        return devs[i]
    return _jax().devices("cpu")[0]


def devices(n=None):
    """Return the first ``n`` devices (all when ``n`` is None), with a clear error if too few."""
    devs = try_all_gpus()
    if n is None:
        return devs
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"the number of devices must be a positive integer, got {n!r}")
    if n > len(devs):
        kind = devs[0].platform.upper()
        hint = (f"Simulate more CPU devices: restart Python and call "
                f"d2l_multi.simulate_devices({n}) first (or set JAX_NUM_CPU_DEVICES={n})."
                if kind == "CPU" else "Use at most that many.")
        raise ValueError(f"asked for {n} devices but JAX sees only {len(devs)} {kind} "
                         f"device(s). {hint}")
    return devs[:n]


def describe(devs):
    """A short human label for a list of devices, e.g. ``'8 cpu devices'``."""
    kinds = sorted({d.platform for d in devs})
    return f"{len(devs)} {'/'.join(kinds)} device{'s' if len(devs) != 1 else ''}"

