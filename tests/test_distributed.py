"""Multi-process training on one machine: the launcher, initialize_distributed and their faults.

Every job runs on 127.0.0.1 only. The equivalence test proves that 2 processes x 4 devices
reach the same parameters as 1 process x 8 devices on the same global batches; the fault tests
(each bounded well under a minute) kill a worker, take the port, and pass wrong counts.
"""
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest

import d2l_multi as d2l
from d2l_multi import launch, mp_train

PY = sys.executable


class Job:
    """A launcher subprocess whose merged output is read line by line in the background."""

    def __init__(self, launcher_args, command):
        env = dict(os.environ, D2L_MULTI_SMOKE="1", MPLBACKEND="Agg")
        self.proc = subprocess.Popen(
            [PY, "-m", "d2l_multi", "launch", *launcher_args, "--", *command], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines, self._queue = [], queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, text, timeout):
        """Return the first output line containing ``text``; fail after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            if line is None:
                break
            self.lines.append(line)
            if text in line:
                return line
        raise AssertionError(f"no line with {text!r} within {timeout} s:\n" + self.output)

    def finish(self, timeout):
        """Wait for the launcher to exit; return its exit status."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"the launcher did not exit within {timeout} s:\n"
                                 + self.output)
        while (line := self._queue.get(timeout=5)) is not None:
            self.lines.append(line)
        return code

    @property
    def output(self):
        return "\n".join(self.lines)


def worker_pids(job):
    """{'p0': pid, ...} from the launcher's 'started p0 (pid 123), ...' line."""
    line = job.wait_for("[launch] started", timeout=20)
    parts = line.split("started ", 1)[1].split(", ")
    return {p.split()[0]: int(p.split("pid ")[1].rstrip(")")) for p in parts}


def alive(pid):
    """True while ``pid`` is a running (not zombie) process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def mp_args(tmp_path=None, **kw):
    argv = ["--num-train", "1024", "--num-val", "256", "--batch-size", "128"]
    argv += [f"--{k.replace('_', '-')}={v}" for k, v in kw.items()]
    if tmp_path is not None:
        argv += ["--out", str(tmp_path)]
    return argv


def test_two_processes_match_one_process(tmp_path):
    """2 processes x 4 devices == 1 process x 8 devices after k steps on the same batches."""
    job = Job(["--processes", "2", "--devices-per-process", "4"],
              [PY, "-m", "d2l_multi.mp_train", *mp_args(tmp_path, steps=4)])
    assert job.finish(timeout=80) == 0, job.output
    assert "process 1 of 2: 4 local cpu devices of 8" in job.output
    multi = np.load(tmp_path / "params.npz")
    multi = [multi[f"arr_{i}"] for i in range(len(multi.files))]
    args = mp_train.parser().parse_args(mp_args(steps=4))   # the same run, in this process
    assert jax.process_count() == 1 and jax.device_count() == 8
    single, history = mp_train.train(args)
    assert history[-1]["steps"] == 4
    for a, b in zip(multi, single):
        np.testing.assert_allclose(a, np.asarray(b), rtol=1e-4, atol=1e-6)
    # the checkpoint the two processes wrote together restores in one process with 8 devices
    restored = mp_train.Checkpoints(tmp_path / "checkpoints").restore(1, single)
    for a, b in zip(multi, restored):
        np.testing.assert_array_equal(a, np.asarray(b))


def test_killed_worker_stops_the_job(tmp_path):
    """Kill p1 mid-run: the launcher stops p0, exits non-zero naming p1, leaves no process."""
    job = Job(["-n", "2", "--devices-per-process", "2", "--grace-period", "2"],
              [PY, "-m", "d2l_multi.mp_train", *mp_args(tmp_path, epochs=1000)])
    pids = worker_pids(job)
    job.wait_for("[p0] epoch 1:", timeout=50)
    os.kill(pids["p1"], signal.SIGKILL)
    killed = time.monotonic()
    code = job.finish(timeout=30)
    stopped_after = time.monotonic() - killed
    assert code == 128 + signal.SIGKILL, job.output
    assert "FAILED: worker p1 died first (killed by SIGKILL)" in job.output
    assert stopped_after < 15, f"the job took {stopped_after:.1f} s to stop"
    assert not any(alive(pid) for pid in pids.values()), job.output
    # only complete checkpoints are visible, and the latest one restores
    ckpt = mp_train.Checkpoints(tmp_path / "checkpoints")
    if ckpt.latest() is not None:
        ckpt.restore(ckpt.latest(), mp_train.init_params(mp_train.data_mesh()))


WAIT_FOREVER = """
import time, d2l_multi as d2l
d2l.initialize_distributed()
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((jax.device_count(),), ('d',), axis_types=(jax.sharding.AxisType.Auto,))
total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P('d')), jnp.ones(2))
print('ready', float(total(x)), flush=True)
while True:
    total(x).block_until_ready()
"""


def test_survivor_fails_fast_without_launcher():
    """Without the launcher, JAX's heartbeat makes the survivor abort soon after a peer dies."""
    port, procs = launch.free_port(), []
    for i in range(2):
        env = launch.worker_env(i, 2, 2, port, heartbeat_timeout=5)
        procs.append(subprocess.Popen([PY, "-c", WAIT_FOREVER], env=env, text=True,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    try:
        for p in procs:
            line = p.stdout.readline()
            while line and not line.startswith("ready"):
                line = p.stdout.readline()
            assert line.startswith("ready 4.0"), line
        procs[1].kill()
        killed = time.monotonic()
        code = procs[0].wait(timeout=40)
        waited = time.monotonic() - killed
        output = procs[0].stdout.read()
        assert code != 0
        assert waited < 25, f"the survivor took {waited:.1f} s to notice"
        assert "another task died" in output or "heartbeat" in output, output[-2000:]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_port_in_use(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code = launch.main(["--port", str(port), "--", PY, "-c", "pass"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is already in use" in err and "--port" in err


@pytest.mark.parametrize("argv,message", [
    (["--processes", "0"], "--processes must be at least 1, got 0"),
    (["-n", "-3"], "--processes must be at least 1, got -3"),
    (["--devices-per-process", "0"], "--devices-per-process must be at least 1, got 0"),
])
def test_wrong_counts(capsys, argv, message):
    assert launch.main([*argv, "--", PY, "-c", "pass"]) == 2
    assert message in capsys.readouterr().err


def test_no_command(capsys):
    assert launch.main(["-n", "2"]) == 2
    assert "no command to run" in capsys.readouterr().err


def test_launcher_settings_checks_process_id():
    env = {"D2L_MULTI_COORDINATOR_ADDRESS": "127.0.0.1:1234", "D2L_MULTI_NUM_PROCESSES": "2",
           "D2L_MULTI_PROCESS_ID": "2", "D2L_MULTI_DEVICES_PER_PROCESS": "4"}
    with pytest.raises(ValueError, match="PROCESS_ID=2 but the job has only 2 processes"):
        d2l.launcher_settings(env)
    with pytest.raises(ValueError, match="NUM_PROCESSES='two' is not an integer"):
        d2l.launcher_settings({**env, "D2L_MULTI_NUM_PROCESSES": "two"})
    assert d2l.launcher_settings({**env, "D2L_MULTI_PROCESS_ID": "1"})["process_id"] == 1
    assert d2l.launcher_settings({}) is None


def test_mismatched_device_counts():
    """A process with fewer devices than the others is refused by every process."""
    worker = ('if [ "$D2L_MULTI_PROCESS_ID" = 1 ]; then export '
              'D2L_MULTI_DEVICES_PER_PROCESS=2; fi; exec "$0" -c '
              '"import d2l_multi as d2l; d2l.initialize_distributed()"')
    job = Job(["-n", "2", "--devices-per-process", "4"], ["sh", "-c", worker, PY])
    assert job.finish(timeout=40) != 0
    assert "process 0: 4, process 1: 2" in job.output
    assert "--devices-per-process" in job.output


def test_detect_cluster():
    slurm = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_NTASKS": "2",
             "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
    assert d2l.detect_cluster(slurm) == "slurm"
    assert d2l.detect_cluster({**slurm, "SLURM_NTASKS": "1"}) is None  # one task: alone
    assert d2l.detect_cluster({"OMPI_MCA_orte_hnp_uri": "x", "OMPI_COMM_WORLD_SIZE": "4"}) \
        == "ompi"
    assert d2l.detect_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}) is None  # a pod
    assert d2l.detect_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1",
                               "JOB_COMPLETION_INDEX": "0"}) == "k8s"
    assert d2l.detect_cluster({}) is None


def test_alone_is_a_no_op(monkeypatch):
    for name in ["D2L_MULTI_COORDINATOR_ADDRESS", "SLURM_JOB_ID", "OMPI_MCA_orte_hnp_uri",
                 "KUBERNETES_SERVICE_HOST", "TPU_WORKER_HOSTNAMES"]:
        monkeypatch.delenv(name, raising=False)
    assert d2l.initialize_distributed() == (0, 1)
    assert not jax.distributed.is_initialized()


def test_process_batches_split_global_batches(monkeypatch):
    """Process p of 2 gets rows p*b/2..(p+1)*b/2 of every global batch; padding weighs 0."""
    X, y = np.arange(10)[:, None], np.arange(10)
    whole = list(d2l.process_batches(X, y, 4, shuffle=True, seed=1))
    assert len(whole) == 2  # the last incomplete batch is dropped in training
    parts = []
    for p in range(2):
        monkeypatch.setattr(jax, "process_count", lambda: 2)
        monkeypatch.setattr(jax, "process_index", lambda p=p: p)
        parts.append(list(d2l.process_batches(X, y, 4, shuffle=True, seed=1)))
    for (Xw, yw, _), (X0, y0, _), (X1, y1, _) in zip(whole, *parts):
        np.testing.assert_array_equal(Xw, np.concatenate([X0, X1]))
        np.testing.assert_array_equal(yw, np.concatenate([y0, y1]))
    monkeypatch.undo()
    evals = list(d2l.process_batches(X, y, 4))  # evaluation: padded, not dropped
    assert [w.tolist() for *_, w in evals] == [[1] * 4, [1] * 4, [1, 1, 0, 0]]


def test_workers_die_with_the_launcher():
    """Even a launcher killed with SIGKILL leaves no worker behind (Linux)."""
    if not sys.platform.startswith("linux"):
        pytest.skip("PR_SET_PDEATHSIG is Linux-only")
    job = Job(["-n", "2"], ["sleep", "60"])
    pids = worker_pids(job)
    job.proc.kill()
    job.proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in pids.values())


def test_gloo_chatter_is_dropped():
    chatter = "Expected number of connected peer ranks is : 7"
    assert launch.drop_gloo_chatter(f"[Gloo] Rank 3 is connected to 7 peer ranks. {chatter}") \
        == ""
    assert launch.drop_gloo_chatter(f"7 is connected to 7 peer ranks. {chatter}") == ""
    assert launch.drop_gloo_chatter("0 is connected to ") == ""
    assert launch.drop_gloo_chatter("epoch 1: loss [Gloo] Rank ") == "epoch 1: loss "
    assert launch.drop_gloo_chatter("epoch 1: loss 2.3") == "epoch 1: loss 2.3"
