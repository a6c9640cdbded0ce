"""``python -m d2l_multi benchmark [lenet | profile | collectives | predict | models]``: bad options
are refused in one line with a non-zero status, each subcommand runs in smoke mode, PyTorch's
baseline runs at its best CPU settings, and the profile sorts a step's operations into parts."""
import importlib.util
import os
import subprocess
import sys
import textwrap

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
    (["lenet", "--rounds", "0"], "--rounds must be a positive integer, e.g. --rounds 3; got 0"),
    (["profile", "--steps", "0"], "--steps must be a positive integer, e.g. --steps 20; got 0"),
    (["profile", "--batch-size", "100"], "100 does not divide evenly over 8 devices"),
    (["lenet", "--batch-size", "4096"], "--batch-size 4096 is larger than the 2048 training "
                                        "images loaded (the smoke switch keeps a sample)"),
    (["profile", "--batch-size", "4096"], "--batch-size 4096 is larger than the 2048"),
    (["collectives", "--devices", "1,2"], "--devices: every count must be at least 2"),
    (["collectives", "--devices", "two"], "--devices takes comma-separated integers"),
    (["collectives", "--collectives", "psum,broadcast"], "unknown 'broadcast'"),
    (["collectives", "--collectives", ""], "unknown ''; choose from"),
    (["collectives", "--max-mb", "0"], "--max-mb must be a positive integer"),
    (["collectives", "--repeat", "-3"], "--repeat must be a positive integer"),
    (["predict", "--batch-size", "100", "--devices", "1,8"], "100 does not divide evenly over 8"),
    (["predict", "--devices", "0,2"], "--devices: every count must be at least 1"),
    (["models", "--width", "0"], "--width must be a positive integer, e.g. --width 64; got 0"),
    (["frobnicate"], "invalid choice: 'frobnicate' (choose from 'lenet', 'profile', "
                     "'collectives', 'predict', 'models')"),
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
    assert all(name in result.stdout for name in ("lenet", "profile", "collectives", "predict",
                                                  "models"))


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
    out = result.stdout
    assert "straightforward (d2l text): pmap, NCHW, host batches" in out
    assert "| chapter jit + NamedSharding, data on device | 2 dev |" in out
    assert "| chapter d2l.train without its allreduce (not data parallel) | 2 dev |" in out
    assert "the allreduce's share of chapter d2l.train's epoch on 2 devices:" in out
    assert ("| formulation | devices | ms/step (min) | CPU ms/step (min) | s/epoch (min) | "
            "s/epoch (median) |") in out
    assert "XLA_FLAGS:" in out and "round 1/1 done, load average" in out
    if importlib.util.find_spec("torch"):
        assert "| PyTorch eager, channels-last | 1 CPU |" in out and "one per core" in out
        assert "chapter d2l.train, 1 device / PyTorch eager (faster layout):" in out


@pytest.mark.skipif(not os.environ.get("D2L_MULTI_DATA"), reason="needs the data locally")
def test_profile_breaks_the_step_into_parts_in_smoke_mode():
    result = benchmark("profile", "--devices", "2", "--steps", "2")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "PJRT_NPROC=1 (one thread)" in out and "| part | JAX, chapter |" in out
    assert "| convolutions, kernel gradient |" in out and "host-to-device copy" in out
    assert "2 steps of 128 images, one device's share on 2 devices" in out


def test_the_profile_sorts_a_steps_operations_into_parts():
    """Each convolution of LeNet's SGD step is found as forward, input gradient or kernel
    gradient, from the compiled program alone."""
    import jax

    import d2l_multi as d2l
    from d2l_multi.commands.benchmark import hlo_instructions, jax_part

    def step(params, X, y):
        grads = jax.grad(d2l.loss_fn)(params, X, y)
        return [p - 0.1 * g for p, g in zip(params, grads)]
    params = d2l.init_lenet_params(jax.random.key(0))
    X, y = jax.numpy.zeros((8, 28, 28, 1)), jax.numpy.zeros(8, "int32")
    table = hlo_instructions(jax.jit(step).lower(params, X, y).compile().as_text())
    kernels = {tuple(sorted(p.shape)) for p in params if p.ndim == 4}
    parts = [jax_part(*row, kernels) for row in table.values()]
    assert parts.count("convolutions, forward") == 2           # conv1, conv2
    assert parts.count("convolutions, kernel gradient") == 2   # dW1, dW2
    assert parts.count("convolutions, input gradient") == 1    # conv1's input is the data
    assert "SGD update" in parts and "dense layers, forward and backward" in parts


def test_xla_cpu_defaults_give_one_program_ynnpack_back():
    """The straightforward row compiles with XLA:CPU's default libraries, beside the chapter's."""
    import jax

    import d2l_multi as d2l
    from d2l_multi.commands.benchmark import xla_cpu_defaults
    options = xla_cpu_defaults()
    if not options:
        pytest.skip("this jaxlib's defaults are not known here")
    f = jax.jit(jax.grad(lambda W, X: d2l.conv2d(X, W, 0.0).sum()))
    lowered = f.lower(jax.numpy.ones((5, 5, 20, 50)), jax.numpy.ones((8, 13, 13, 20)))
    assert "__ynn_fusion" not in lowered.compile().as_text()
    assert "__ynn_fusion" in lowered.compile(options).as_text()


def test_xla_cpu_defaults_are_what_xla_cpu_does_without_the_chapters_flag():
    """In a process without XLA_FLAGS, LeNet's gradient compiles to the same program with
    ``xla_cpu_defaults()`` as without options: the row named "XLA:CPU defaults" is that."""
    script = textwrap.dedent("""
        import re, sys, jax, numpy as np, d2l_multi as d2l
        from d2l_multi.commands.benchmark import xla_cpu_defaults
        options = xla_cpu_defaults()
        X, y = np.zeros((256, 28, 28, 1), np.float32), np.zeros(256, np.int32)
        lowered = jax.jit(jax.value_and_grad(d2l.loss_fn)).lower(
            d2l.init_lenet_params(jax.random.key(0)), X, y)
        text = lambda o: re.sub(r"[.]\\d+", "", lowered.compile(o).as_text())
        print(bool(options), text({}) == text(options), "__ynn_fusion" in text({}))
    """)
    env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
    out = subprocess.run([sys.executable, "-c", script], env={**env, "JAX_PLATFORMS": "cpu"},
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    known, same, ynnpack = out.stdout.split()
    if known == "False":
        pytest.skip("this jaxlib's defaults are not known here")
    assert same == "True" and ynnpack == "True"


def test_pytorch_baseline_uses_a_thread_per_core_and_channels_last_on_request():
    torch = pytest.importorskip("torch")
    import numpy as np

    from d2l_multi.commands.benchmark import _TorchRow, lenet_ratios, torch_threads
    assert torch_threads() == len(os.sched_getaffinity(0))
    X, y = np.zeros((16, 28, 28, 1), np.float32), np.zeros(16, np.int32)
    row = _TorchRow(X, y, batch=8, channels_last=True, warmup=1)
    assert row.X.is_contiguous(memory_format=torch.channels_last)
    assert row.net[0].weight.is_contiguous(memory_format=torch.channels_last)
    assert row.time(1) > 0
    results = {("straightforward (d2l text)", "1 dev"): (40.0, 44.0),
               ("straightforward (d2l text)", "8 dev"): (30.0, 33.0),
               ("chapter d2l.train: pmap, NHWC, d2l.conv2d", "1 dev"): (20.0, 22.0),
               ("chapter d2l.train: pmap, NHWC, d2l.conv2d", "8 dev"): (15.0, 16.5),
               ("PyTorch eager, NCHW", "1 CPU"): (12.0, 13.0),
               ("PyTorch eager, channels-last", "1 CPU"): (10.0, 11.0)}
    assert lenet_ratios(results, 8) == [
        "chapter d2l.train, 1 device / PyTorch eager (faster layout): 2.00 (median), 2.00 (min)",
        "chapter, best 8-device row / PyTorch eager (faster layout): 1.50 (median), 1.50 (min)",
        "speed-up of chapter d2l.train over straightforward (d2l text), 8 devices: "
        "2.00 (median), 2.00 (min)"]


def test_the_allreduce_row_gives_its_share_and_is_never_the_best_row():
    """The row without the allreduce is not a training step: the ratio lines use it only for
    the allreduce's share, never as the chapter's best 8-device row."""
    from d2l_multi.commands.benchmark import NO_ALLREDUCE, lenet_ratios
    chapter = "chapter d2l.train: pmap, NHWC, d2l.conv2d"
    results = {("straightforward (d2l text)", "1 dev"): (40.0, 44.0),
               ("straightforward (d2l text)", "8 dev"): (30.0, 33.0),
               (chapter, "1 dev"): (20.0, 22.0), (chapter, "8 dev"): (15.0, 16.5),
               (NO_ALLREDUCE, "8 dev"): (5.0, 6.5),
               ("PyTorch eager, channels-last", "1 CPU"): (10.0, 11.0)}
    lines = lenet_ratios(results, 8)
    assert "chapter, best 8-device row / PyTorch eager (faster layout): 1.50 (median), " \
           "1.50 (min)" in lines
    assert lines[-1] == ("the allreduce's share of chapter d2l.train's epoch on 8 devices: "
                         "10.0 s of 16.5 s (medians)")


def test_an_allreduce_cheaper_than_the_noise_is_not_a_negative_share():
    """When the row without the allreduce is the slower one (the allreduce costs less than
    the rows move between rounds), the line says so instead of printing "-0.0 s"."""
    from d2l_multi.commands.benchmark import NO_ALLREDUCE, lenet_ratios
    chapter = "chapter d2l.train: pmap, NHWC, d2l.conv2d"
    results = {("straightforward (d2l text)", "1 dev"): (40.0, 44.0),
               ("straightforward (d2l text)", "2 dev"): (30.0, 33.0),
               (chapter, "1 dev"): (20.0, 22.0), (chapter, "2 dev"): (10.8, 10.94),
               (NO_ALLREDUCE, "2 dev"): (10.7, 10.97)}
    assert lenet_ratios(results, 2)[-1] == (
        "the allreduce's share of chapter d2l.train's epoch on 2 devices: below the noise "
        "(the row without it took 0.03 s longer; medians 10.9 and 11.0 s)")


def test_a_copy_cheaper_than_the_noise_is_not_a_negative_time():
    from d2l_multi.commands.benchmark import copy_cost
    assert copy_cost(0.0790, 0.0775) == "1.50 ms"
    assert copy_cost(0.0765, 0.0780) == ("below the noise, the step with NumPy inputs 1.50 ms "
                                         "faster")


def test_models_times_lenet_and_resnet_on_one_device_of_each_kind():
    result = benchmark("models", "--width", "4", "--batch-size", "8", "--repeat", "2")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "| model | device | ms/step | images/s | s/epoch | GFLOP/step | TFLOP/s |" in out
    assert "| LeNet | cpu |" in out and "| ResNet-18 (width 4) | cpu |" in out
