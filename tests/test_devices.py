"""Devices: simulation before JAX starts, clear errors after, accelerators never hidden."""
import subprocess
import sys

import jax
import pytest

import d2l_multi as d2l


def run_python(code):
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_import_does_not_start_jax():
    out = run_python("import d2l_multi\nfrom jax._src import xla_bridge\n"
                     "print(xla_bridge.backends_are_initialized())")
    assert out.strip() == "False"


def test_simulate_devices_in_a_fresh_process():
    out = run_python(
        "import d2l_multi as d2l\n"
        "print(len(d2l.simulate_devices(4)))\n"
        "print(len(d2l.simulate_devices(4)))  # same count again: fine\n"
        "try:\n    d2l.simulate_devices(2)\n"
        "except RuntimeError as e:\n    print('ERR', e)\n")
    lines = out.strip().splitlines()
    assert lines[:2] == ["4", "4"]
    assert lines[2].startswith("ERR JAX has already started with 4 CPU device(s)")
    assert "Restart the kernel" in lines[2] and "simulate_devices(2)" in lines[2]


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "8"])
def test_simulate_devices_rejects_bad_counts(bad):
    with pytest.raises(ValueError, match="positive integer"):
        d2l.simulate_devices(bad)


def test_device_lists():
    devs = d2l.try_all_gpus()
    assert devs and devs == jax.devices()        # never [] on a CPU-only machine
    assert d2l.try_gpu() in jax.devices() + jax.devices("cpu")
    assert d2l.try_gpu(1000).platform == "cpu"
    assert d2l.devices() == devs and d2l.devices(2) == devs[:2]
    assert d2l.num_gpus() == len([d for d in devs if d.platform != "cpu"])
    assert d2l.describe(devs[:1]).startswith("1 ")


def test_devices_error_names_count_and_fix():
    n = len(jax.devices())
    with pytest.raises(ValueError, match=rf"asked for 99 devices but JAX sees only {n}") as e:
        d2l.devices(99)
    if jax.devices()[0].platform == "cpu":
        assert "simulate_devices(99)" in str(e.value)
    with pytest.raises(ValueError, match="positive integer"):
        d2l.devices(0)
