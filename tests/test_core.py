"""The chapter's core (notebooks 01-03): LeNet, allreduce, data-parallel SGD, train, CLI."""
import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax
from recording import RecordingData

import d2l_multi as d2l
from d2l_multi.hardware import set_cpu_compiler_flags

N = 8
ATOL = 1e-6  # float32 rounding: the devices sum the same numbers in a different order


def batch(n=64, seed=0):
    rng = np.random.default_rng(seed)
    return (rng.random((n, 28, 28, 1), dtype=np.float32),
            rng.integers(0, 10, n).astype(np.int32))


def test_lenet_shapes_and_param_count():
    params = d2l.init_lenet_params(jax.random.key(0))
    assert sum(p.size for p in params) == 129_068
    assert jax.jit(d2l.lenet)(params, batch(5)[0]).shape == (5, 10)


def test_every_convolution_computes_the_same():
    X = jnp.asarray(batch(4)[0])
    W = jax.random.normal(jax.random.key(1), (3, 3, 1, 20))
    b = jnp.arange(20.0)
    want = jax.jit(d2l.conv2d)(X, W, b)
    np.testing.assert_allclose(d2l.conv2d_im2col(X, W, b), want, atol=1e-5)
    grad = lambda conv: jax.grad(lambda W: conv(X, W, b).sum())(W)
    np.testing.assert_allclose(grad(d2l.conv2d_im2col), grad(d2l.conv2d), rtol=1e-5, atol=1e-4)


def test_lenets_convolutions_are_xlas_own_on_cpu():
    """simulate_devices (conftest) turns YNNPACK off: XLA:CPU computes LeNet's convolutions and
    their gradients itself, far faster than YNNPACK's kernel-gradient convolution."""
    params = d2l.init_lenet_params(jax.random.key(0))
    X, y = batch(8)
    hlo = jax.jit(jax.grad(d2l.loss_fn)).lower(params, X, y).compile().as_text()
    assert "convolution(" in hlo
    if set_cpu_compiler_flags({"XLA_FLAGS": ""}):  # a jaxlib that knows the flag
        assert "__ynn_fusion" not in hlo


def test_ring_allreduce_equals_psum_pmap_and_shard_map():
    from jax.sharding import PartitionSpec as P
    x = jax.random.normal(jax.random.key(0), (N, 13))  # 13 does not divide by 8: padding
    want = jax.pmap(lambda v: lax.psum(v, "i"), axis_name="i")(x)
    got = jax.pmap(lambda v: d2l.ring_allreduce(v, "i"), axis_name="i")(x)
    np.testing.assert_allclose(got, want, atol=1e-5)
    mesh = jax.make_mesh((N,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
    sm = jax.jit(jax.shard_map(lambda v: d2l.ring_allreduce(v, "i"), mesh=mesh,
                               in_specs=P("i"), out_specs=P("i")))
    np.testing.assert_allclose(sm(x), want, atol=1e-5)


@pytest.mark.parametrize("k", [1, 3])
def test_ring_allreduce_on_one_or_an_odd_number_of_devices(k):
    x = jax.random.normal(jax.random.key(0), (k, 5))
    got = jax.pmap(lambda v: d2l.ring_allreduce(v, "i"), axis_name="i",
                   devices=jax.devices()[:k])(x)
    np.testing.assert_allclose(got, jnp.broadcast_to(x.sum(0), x.shape), atol=1e-5)


def test_allreduce_by_hand_gives_everyone_the_sum():
    data = [jax.device_put(jnp.full(3, i + 1.0), d) for i, d in enumerate(jax.devices())]
    out = d2l.allreduce(data)
    assert [x.device for x in out] == [x.device for x in data]
    assert all(float(x[0]) == N * (N + 1) / 2 for x in out)


def test_split_batch_shapes_and_error_names_sizes():
    X, y = batch(64)
    Xs, ys = d2l.split_batch(X, y, N)
    assert Xs.shape == (N, 8, 28, 28, 1) and ys.shape == (N, 8)
    with pytest.raises(ValueError, match=r"250 .* 8 devices.*248 or 256"):
        d2l.split_batch(*batch(250), N)


def test_k_data_parallel_steps_equal_single_device_steps():
    """3 steps of train_batch on 8 devices == 3 single-device SGD steps on the same batches."""
    params = d2l.init_lenet_params(jax.random.key(0))
    single, parallel = params, d2l.replicate(params, d2l.devices(N))
    for k in range(3):
        X, y = batch(64, seed=k)
        grads = jax.grad(d2l.loss_fn)(single, X, y)
        single = [p - 0.1 * g for p, g in zip(single, grads)]
        parallel, _ = d2l.train_batch(parallel, X, y, N, 0.1)
    for s, p in zip(single, parallel):
        assert all(bool((p[i] == p[0]).all()) for i in range(N))  # replicas never drift
        np.testing.assert_allclose(p[0], s, atol=ATOL)


def test_train_small_run_learns_and_nan_stops():
    data = d2l.FashionMNIST(64, num_train=1024, num_val=256)
    _params, history, _ = d2l.train(N, 64, 0.1, 3, data)
    assert len(history) == 3 and history[-1]["test_acc"] > 0.6
    assert history[-1]["loss"] < 1.2  # ln 10 = 2.30 at the start
    with pytest.raises(FloatingPointError, match=r"lr=1e\+30.*lower lr by factors of 10"):
        d2l.train(N, 64, 1e30, 1, data)


def test_train_reshuffles_every_epoch_and_a_rerun_sees_the_same_batches():
    data = RecordingData()
    d2l.train(1, 8, 0.1, 2, data)
    d2l.train(1, 8, 0.1, 2, data)
    assert data.epochs == [0, 1, 0, 1]


def test_save_atomic_gives_a_new_file_s_mode_without_touching_the_umask(tmp_path,
                                                                       monkeypatch):
    """Setting the umask to read it would change it, for a moment, for every thread."""
    from d2l_multi.commands.common import save_atomic
    old = os.umask(0o027)
    try:
        def no_umask(mask):
            raise AssertionError("save_atomic changed the umask")
        monkeypatch.setattr(os, "umask", no_umask)
        path = save_atomic(tmp_path / "r.json", lambda tmp: pathlib.Path(tmp).write_text("{}"))
    finally:
        monkeypatch.undo()
        os.umask(old)
    assert path.read_text() == "{}" and path.stat().st_mode & 0o777 == 0o640
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]


def test_help_lists_every_command():
    for flag in ("--help", "-h"):
        result = run_cli(flag)
        assert result.returncode == 0, result.stderr
        for command in ("train", "benchmark", "launch", "book", "classroom"):
            assert f"\n    {command}" in result.stdout, result.stdout
        assert "python -m d2l_multi COMMAND --help" in result.stdout


def run_cli(*args):
    env = dict(os.environ, D2L_MULTI_SMOKE="1")
    return subprocess.run([sys.executable, "-m", "d2l_multi", *args], capture_output=True,
                          text=True, env=env, timeout=300)


def test_cli_train_on_one_device_simulates_one_device(tmp_path):
    """XLA:CPU sizes its thread pool for the simulated devices: a one-device run asks for one."""
    result = run_cli("train", "--devices", "1", "--epochs", "1", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "using 1 CPU devices" in result.stdout and "1 cpu device available" in result.stdout
    assert "simulated CPU devices sharing" not in result.stdout  # one device: no such remark


@pytest.mark.parametrize("args,message", [
    (["train", "--devices", "1,16"], "only 8 simulated CPU devices exist; pass --cpu-devices 16"),
    (["train", "--batch-size", "250"], "250 does not divide evenly over 8 devices"),
    (["train", "--epochs", "0"], "--epochs: must be a finite number > 0, got 0"),
    (["train", "--epochs", "-2"], "--epochs: must be a finite number > 0, got -2"),
    (["train", "--lr", "-0.1"], "--lr: must be a finite number > 0"),
    (["train", "--lr", "nan"], "--lr: must be a finite number > 0, got nan"),
    (["train", "--lr", "inf"], "--lr: must be a finite number > 0, got inf"),
    (["train", "--batch-size", "0"], "--batch-size: must be a finite number > 0"),
    (["train", "--devices", "two"], "integers or 'all'"),
    (["train", "--out", "/dev/null/runs"], "--out /dev/null/runs: /dev/null is a file, not a "
                                            "folder"),
    (["frobnicate"], "invalid choice: 'frobnicate'"),
])
def test_cli_bad_arguments_exit_non_zero_with_one_message(args, message, tmp_path):
    result = run_cli(*args)
    assert result.returncode in (1, 2), result.stderr
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


def test_cli_out_that_is_a_file_is_refused_before_training(tmp_path):
    taken = tmp_path / "results"
    taken.write_text("keep me")
    result = run_cli("train", "--out", str(taken))
    assert result.returncode == 1 and "is a file, not a folder" in result.stderr
    assert taken.read_text() == "keep me" and "Traceback" not in result.stderr


def test_cli_missing_data_prints_the_three_ways_without_a_traceback(tmp_path):
    """A full run with no copy anywhere (Debian's folder hidden too) and no network."""
    env = {k: v for k, v in os.environ.items() if k not in ("D2L_MULTI_DATA", "D2L_MULTI_SMOKE")}
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")
    code = ("from d2l_multi import data, commands as m\n"
            "for spec in data.DATASETS.values(): spec['debian'] = None\n"
            f"raise SystemExit(m.main(['train', '--epochs', '1', '--out', {str(tmp_path)!r}]))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=300)
    assert result.returncode == 1, result.stderr
    assert "Provide the data in one of three ways" in result.stderr
    assert "Traceback" not in result.stderr


def test_cli_train_with_cpu_devices_trains_every_count_in_one_process(tmp_path):
    result = run_cli("train", "--devices", "1,2", "--cpu-devices", "2", "--epochs", "1",
                     "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    recorded = json.loads((tmp_path / "results.json").read_text())
    assert [(r["devices"], r["process_devices"]) for r in recorded["runs"]] == [(1, 2), (2, 2)]
    # the one-device run shares the 2-device process's thread pool, and the output says so
    assert "for the time of 1 device in a process of its own, run `python -m d2l_multi " \
           "train --devices 1`." in result.stdout


def test_a_run_apart_that_fails_or_overruns_is_named_and_leaves_no_process(monkeypatch):
    from d2l_multi.commands import train as cli
    monkeypatch.setenv("D2L_MULTI_SMOKE", "1")
    with pytest.raises(ChildProcessError, match=r"the 1-device run in a process of its own "
                       r"failed \(exit code 2\); its messages are above"):
        cli._run_apart(1, 256, 0.1, 0, 300, dict(os.environ))  # 0 epochs: the child refuses them
    with pytest.raises(ChildProcessError) as failed:
        cli._run_apart(1, 256, 0.1, 1, 2, dict(os.environ))
    message = str(failed.value)
    assert "did not finish within 2 s and was stopped; pass --cpu-devices" in message
    pid = int(message.split("(pid ")[1].split(")")[0])
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def _pids_mentioning(text):
    """The processes whose command line holds ``text``, read from /proc."""
    found = []
    for cmdline in pathlib.Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if text.encode() in cmdline.read_bytes():
                found.append(int(cmdline.parent.name))
        except OSError:
            pass
    return found


@pytest.mark.skipif(not pathlib.Path("/proc/self/stat").exists(), reason="needs Linux /proc")
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_stopping_train_stops_its_run_apart_and_removes_its_folder(tmp_path, sig):
    env = dict(os.environ, D2L_MULTI_SMOKE="1", TMPDIR=str(tmp_path))
    code = ("import os, sys\nfrom d2l_multi import commands as m\n"
            "from d2l_multi.commands import train as cli\n"
            "sys.exit(m.run('train', lambda: cli._run_apart(1, 256, 0.1, 200, 600, "
            "dict(os.environ))))")  # what train does for a smaller device count
    parent = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, text=True)
    try:
        child, deadline = None, time.monotonic() + 60
        while child is None and parent.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)  # the run apart is the process whose --out lies in tmp_path
            child = next(iter(_pids_mentioning(str(tmp_path))), None)
        assert child is not None, "no run apart started"
        time.sleep(1)
        parent.send_signal(sig)
        _, err = parent.communicate(timeout=60)
    finally:
        parent.kill()
    assert parent.returncode == 130 and "train: interrupted" in err, err
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
    assert not list(tmp_path.glob("d2l_multi-train-*"))  # its folder, removed


def test_cli_train_smoke_writes_table_and_plots(tmp_path, monkeypatch):
    for name in ("PJRT_NPROC", "NPROC"):  # as in a reader's shell
        monkeypatch.delenv(name, raising=False)
    result = run_cli("train", "--devices", "1,8", "--epochs", "1", "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "devices  batch     lr sec/epoch test acc" in result.stdout
    assert "8 cpu devices · epoch 1/1" in result.stderr  # the progress bar names the run
    # what a recorded run needs: the machine, the versions and the whole command's time
    lines = result.stdout.splitlines()
    assert any(line.startswith("machine: ") for line in lines) and "python 3." in result.stdout
    assert "wall time " in result.stdout
    # the one-device run trains in a process simulating one device, and the output says so
    assert "ran in processes of their own, each simulating only its devices" in result.stdout
    assert result.stdout.count("test acc: ") == 2
    recorded = json.loads((tmp_path / "results.json").read_text())
    assert [(r["devices"], r["process_devices"]) for r in recorded["runs"]] == [(1, 1), (8, 8)]
    # each with XLA:CPU's pool sized for its own devices (at least 2 threads per device)
    cores = len(os.sched_getaffinity(0))
    assert [r["cpu_threads"] for r in recorded["runs"]] == [max(cores, 2), max(cores, 16)]
    assert sorted(p.name for p in tmp_path.iterdir()) == [  # .lock: the run held the folder
        ".lock", "accuracy.png", "results.json", "sec_per_epoch.png"]
    assert recorded["wall_sec"] > 0 and recorded["versions"].startswith("python 3.")
    for name in ("accuracy.png", "sec_per_epoch.png", "results.json"):
        assert (tmp_path / name).stat().st_size > 100
    assert (tmp_path / "accuracy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
