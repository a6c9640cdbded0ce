"""``python -m d2l_multi benchmark [lenet | collectives | predict | models]``: bad options are refused in
one line with a non-zero status, and each subcommand runs in smoke mode."""
import os
import subprocess
import sys

import pytest


def benchmark(*args):
    env = dict(os.environ, D2L_MULTI_SMOKE="1")
    return subprocess.run([sys.executable, "-m", "d2l_multi", "benchmark", *args],
                          capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.parametrize("args,message", [
    (["--steps", "-1"], "--steps must be a positive integer, e.g. --steps 60; got -1"),
    (["lenet", "--steps", "0"], "--steps must be a positive integer"),
    (["lenet", "--batch-size", "0"], "--batch-size must be a positive integer"),
    (["lenet", "--devices", "0"], "--devices must be a positive integer"),
    (["lenet", "--batch-size", "250"], "250 does not divide evenly over 8 devices"),
    (["lenet", "--steps", "many"], "argument --steps: invalid int value: 'many'"),
    (["lenet", "--frobnicate"], "unrecognized arguments: --frobnicate"),
    (["collectives", "--devices", "1,2"], "--devices: every count must be at least 2"),
    (["collectives", "--devices", "two"], "--devices takes comma-separated integers"),
    (["collectives", "--collectives", "psum,broadcast"], "unknown broadcast"),
    (["collectives", "--max-mb", "0"], "--max-mb must be a positive integer"),
    (["collectives", "--repeat", "-3"], "--repeat must be a positive integer"),
    (["predict", "--batch-size", "100", "--devices", "1,8"], "100 does not divide evenly over 8"),
    (["predict", "--devices", "0,2"], "--devices: every count must be at least 1"),
    (["models", "--width", "0"], "--width must be a positive integer, e.g. --width 64; got 0"),
    (["frobnicate"], "unknown benchmark 'frobnicate'; use one of lenet, collectives, predict, models"),
])
def test_bad_options_exit_non_zero_with_one_line(args, message):
    result = benchmark(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_help_lists_the_subcommands():
    result = benchmark("--help")
    assert result.returncode == 0
    assert all(name in result.stdout for name in ("lenet", "collectives", "predict", "models"))


def test_collectives_prints_the_machine_the_table_and_the_fit():
    result = benchmark("collectives", "--devices", "2,4", "--collectives", "psum,ppermute",
                       "--repeat", "2")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "machine:" in out and "jax 0" in out and "load average" in out
    assert "| psum | 4 | 8192 |" in out and "| ppermute | 2 | 2048 |" in out
    assert "| collective | devices | alpha µs | 1/beta GB/s" in out
    assert "[SMOKE RUN: not results]" in out


def test_predict_prints_measured_and_predicted_step_times():
    result = benchmark("predict", "--devices", "1,2", "--repeat", "2")
    assert result.returncode == 0, result.stderr
    assert "| devices | p | measured ms | predicted ms | error |" in result.stdout
    assert "\n| 2 | " in result.stdout


@pytest.mark.skipif(not os.environ.get("D2L_MULTI_DATA"), reason="needs the data locally")
def test_lenet_is_the_default_and_runs_in_smoke_mode():
    result = benchmark("--devices", "2", "--steps", "2")
    assert result.returncode == 0, result.stderr
    assert "straightforward (d2l text): pmap, NCHW, host batches" in result.stdout
    assert "chapter jit + NamedSharding, data on device | 2 dev |" in result.stdout


def test_models_times_lenet_and_resnet_on_one_device_of_each_kind():
    result = benchmark("models", "--width", "4", "--batch-size", "8", "--repeat", "2")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "| model | device | ms/step | images/s | s/epoch | GFLOP/step | TFLOP/s |" in out
    assert "| LeNet | cpu |" in out and "| ResNet-18 (width 4) | cpu |" in out
