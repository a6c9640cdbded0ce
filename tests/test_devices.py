"""Devices: simulation before JAX starts, clear errors after, the choice between accelerators
and simulated CPU devices, and a package whose import is light and order-free."""
import pathlib
import random
import subprocess
import sys
from types import SimpleNamespace

import jax
import pytest

import d2l_multi as d2l
from d2l_multi.hardware import (
    choose_devices,
    set_cpu_compiler_flags,
    size_cpu_thread_pool,
)


def run_python(code, timeout=120):
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=timeout)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_import_does_not_start_jax_nor_load_heavy_libraries():
    out = run_python("import sys, d2l_multi\n"
                     "print(sorted(m for m in ('jax', 'flax', 'optax', 'orbax', 'grain', "
                     "'keras', 'matplotlib') if m in sys.modules))\n"
                     "import jax\nfrom jax._src import xla_bridge\n"
                     "print(xla_bridge.backends_are_initialized())")
    assert out.split() == ["[]", "False"]


def test_names_are_listed_and_load_on_first_use():
    out = run_python("import sys, d2l_multi as d2l\n"
                     "print('TransformerLM' in dir(d2l), 'flax' in sys.modules)\n"
                     "d2l.TransformerLM\nprint('flax' in sys.modules)")
    assert out.split() == ["True", "False", "True"]
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        _ = d2l.no_such_name


def test_modules_import_in_any_order():
    """Nothing depends on the order in which the package's modules are imported."""
    modules = sorted(p.stem for p in pathlib.Path(d2l.__file__).parent.glob("*.py")
                     if p.stem not in ("__init__", "__main__"))
    for seed in range(3):
        order = random.Random(seed).sample(modules, len(modules))
        code = ("import importlib, types, d2l_multi as d2l\n"
                f"for m in {order!r}:\n    importlib.import_module('d2l_multi.' + m)\n"
                "bad = [n for n in d2l.__all__ if isinstance(getattr(d2l, n), types.ModuleType)]\n"
                "print(len(d2l.__all__), bad)")
        count, bad = run_python(code, timeout=300).split(maxsplit=1)
        assert int(count) == len(d2l.__all__) and bad.strip() == "[]", order


def test_simulate_devices_in_a_fresh_process():
    out = run_python(
        "import d2l_multi as d2l\n"
        "print(len(d2l.simulate_devices(4)))\n"
        "print(len(d2l.simulate_devices(4)))  # same count again: fine\n"
        "try:\n    d2l.simulate_devices(2)\n"
        "except RuntimeError as e:\n    print('ERR', e)\n")
    lines = out.strip().splitlines()
    assert lines[0] == "d2l_multi: using 4 CPU devices (no accelerator found)"  # said once
    assert lines[1:3] == ["4", "4"]
    assert lines[3].startswith("ERR JAX has already started with 4 CPU device(s)")
    assert "Restart the kernel" in lines[3] and "simulate_devices(2)" in lines[3]


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "8"])
def test_simulate_devices_rejects_bad_counts(bad):
    with pytest.raises(ValueError, match="positive integer"):
        d2l.simulate_devices(bad)


def fake(platform, n):
    return [SimpleNamespace(platform=platform, id=i) for i in range(n)]


@pytest.mark.parametrize("gpus,chosen,reason", [
    (0, "cpu", "8 CPU devices (no accelerator found)"),
    (1, "cpu", "8 simulated CPU devices: with a single GPU there is nothing to split over, "
               "so the CPU is JAX's default backend (jax.devices() and jax.make_mesh use the "
               "CPU devices); the GPU stays available as jax.devices('gpu')[0]"),
    (2, "cpu", "8 simulated CPU devices: 2 GPUs are fewer than the 8 devices asked for, so "
               "the CPU is JAX's default backend (jax.devices() and jax.make_mesh use the CPU "
               "devices); the GPUs stay available as jax.devices('gpu')"),
    (7, "cpu", None),
    (8, "gpu", "8 GPU devices"),
    (16, "gpu", "16 GPU devices"),
])
def test_the_chapter_uses_accelerators_when_there_are_as_many_as_it_asks_for(
        gpus, chosen, reason):
    # a notebook asks for 8 devices (jax.make_mesh((8,), ...)): with 2-7 GPUs it would fail
    devices, why = choose_devices(fake("gpu", gpus), fake("cpu", 8))
    assert {d.platform for d in devices} == {chosen}
    assert reason is None or why == reason
    assert len(devices) == (gpus if chosen == "gpu" else 8)


@pytest.mark.parametrize("gpus,cpus,chosen", [(1, 1, "cpu"), (2, 1, "gpu"), (2, 2, "gpu"),
                                               (3, 4, "cpu")])
def test_fewer_simulated_devices_ask_for_fewer_accelerators(gpus, cpus, chosen):
    devices, why = choose_devices(fake("gpu", gpus), fake("cpu", cpus))
    assert devices[0].platform == chosen
    if (gpus, cpus) == (1, 1):
        assert why.startswith("1 simulated CPU device: with a single GPU")


def test_device_lists():
    devs = d2l.try_all_gpus()
    assert devs and devs == jax.devices()        # never [] on a CPU-only machine
    assert d2l.try_gpu() == devs[0]
    assert d2l.try_gpu(1000).platform == "cpu"
    assert d2l.devices() == devs and d2l.devices(2) == devs[:2]
    assert d2l.num_gpus() == len([d for d in devs if d.platform != "cpu"])
    assert d2l.describe(devs[:1]).startswith("1 ")


def test_devices_error_names_count_and_fix():
    n = len(d2l.devices())
    with pytest.raises(ValueError, match=rf"asked for 99 devices but JAX sees only {n}") as e:
        d2l.devices(99)
    if d2l.devices()[0].platform == "cpu":
        assert "simulate_devices(99)" in str(e.value)
    with pytest.raises(ValueError, match="positive integer"):
        d2l.devices(0)


@pytest.mark.parametrize("shape,axis_names,message", [
    ((3, 2, 2), None, r"mesh shape \(3, 2, 2\) has 3 axes but axis_names \(\) has 0"),
    ((2, 4), ("data",), "has 2 axes but axis_names"),
    ((0,), None, "sizes must be positive integers"),
    ((-1, -1), None, "at most one -1"),
    ((3, -1), None, r"needs a multiple of 3 devices but there are 8.*\(2, 4\)"),
    ((16,), None, "asked for 16 devices"),
])
def test_device_mesh_refuses_bad_shapes(shape, axis_names, message):
    with pytest.raises(ValueError, match=message):
        d2l.device_mesh(shape, axis_names)


@pytest.mark.parametrize("env,cores_or_set", [
    ({}, "16"), ({"PJRT_NPROC": "4"}, "16"), ({"PJRT_NPROC": "64"}, "64"), ({"NPROC": "32"}, None),
])
def test_the_cpu_thread_pool_gets_two_threads_per_device(env, cores_or_set, monkeypatch):
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: {0, 1}, raising=False)
    size_cpu_thread_pool(8, env)
    assert env.get("PJRT_NPROC") == cores_or_set


@pytest.mark.parametrize("env,version,want", [
    ({}, "0.10.2", "--xla_cpu_experimental_ynn_fusion_type="),
    ({"XLA_FLAGS": "--xla_dump_to=/tmp/x"}, "0.11.0",
     "--xla_dump_to=/tmp/x --xla_cpu_experimental_ynn_fusion_type="),
    ({"XLA_FLAGS": "--xla_cpu_experimental_ynn_fusion_type=individual_dot"}, "0.10.2",
     "--xla_cpu_experimental_ynn_fusion_type=individual_dot"),   # the user's own choice stays
    ({}, "0.9.2", None), ({}, "0.12.0", None), ({}, "0.13.0.dev20270101", None),
])
def test_cpu_compiler_flags_are_added_for_the_jaxlib_versions_that_know_them(env, version, want):
    set_cpu_compiler_flags(env, jaxlib_version=version)
    assert env.get("XLA_FLAGS") == want


def test_simulate_devices_turns_ynnpack_off_before_xla_starts():
    """XLA:CPU (jaxlib 0.10) hands LeNet's convolutions to YNNPACK by default; simulate_devices
    sets the flag that makes XLA compute them itself, which XLA reads when it starts."""
    out = run_python(
        "import os, d2l_multi as d2l\nd2l.simulate_devices(2)\n"
        "import jax, jax.numpy as jnp\n"
        "f = jax.jit(jax.grad(lambda W, X: d2l.conv2d(X, W, 0.0).sum()))\n"
        "hlo = f.lower(jnp.ones((5, 5, 20, 50)), jnp.ones((8, 13, 13, 20))).compile().as_text()\n"
        "print(os.environ.get('XLA_FLAGS'), '|', '__ynn_fusion' in hlo)")
    flags, ynn = out.strip().splitlines()[-1].split(" | ")
    if set_cpu_compiler_flags({}):  # a jaxlib that knows the flag
        assert flags.endswith("--xla_cpu_experimental_ynn_fusion_type=") and ynn == "False"


def test_a_plain_loop_of_queued_multi_device_steps_finishes():
    """XLA:CPU deadlocked once more than 32 multi-device steps were queued (its thread pool was
    too small for a blocked launch plus every device's execution); simulate_devices sizes it."""
    code = ("import os\n"
            "os.environ['XLA_FLAGS'] = '--xla_cpu_collective_call_terminate_timeout_seconds=30'\n"
            "import d2l_multi as d2l\nd2l.simulate_devices(8)\n"
            "import jax, jax.numpy as jnp\n"
            "from jax.sharding import NamedSharding, PartitionSpec as P\n"
            "mesh = d2l.device_mesh()\n"
            "x = jax.device_put(jnp.ones((256, 64)) / 16, NamedSharding(mesh, P('data')))\n"
            "step = jax.jit(lambda w, x: w - 1e-3 * (x.T @ x) @ w)  # an all-reduce per step\n"
            "w = jnp.eye(64)\n"
            "for i in range(400):\n    w = step(w, x)            # never waits\n"
            "print('finished', float(w[0, 0]) > 0)")
    assert run_python(code, timeout=240).split()[-2:] == ["finished", "True"]


def test_the_machine_is_described_without_starting_jax():
    """What a timing was measured on (the benchmarks, the book's execution table): CPU, cores,
    load and OS, then the versions, with no JAX backend started."""
    out = run_python("import sys\nfrom d2l_multi.commands import book\n"
                     "from d2l_multi.hardware import describe_machine\n"
                     "print(describe_machine()); print(book.versions())\n"
                     "print(sorted(m for m in ('jax', 'flax') if m in sys.modules))")
    machine, versions, loaded = out.strip().splitlines()
    assert f"{__import__('os').cpu_count()} cores, load average " in machine
    assert versions.startswith("python 3.") and f"jax {jax.__version__}" in versions
    assert loaded == "[]"
