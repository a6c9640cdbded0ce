"""Multi-process training on one machine: the launcher, initialize_distributed, mp_train and
their faults.

Every job runs on 127.0.0.1 only. mp_train stopped and resumed reaches the parameters of an
uninterrupted run, in 1 process (bit for bit) and in 2 processes x 4 devices after a crash (up
to rounding, against 1 process x 8 devices). The fault tests, each bounded, kill a worker and
the launcher, let a worker raise while its peer sleeps, leave a child behind, run out of time,
and feed every command and function wrong values.
"""
import fcntl
import ipaddress
import json
import os
import pathlib
import queue
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

import jax
import numpy as np
import pytest
from trees import assert_trees_close

import d2l_multi as d2l
from d2l_multi import _checks as check
from d2l_multi import commands
from d2l_multi.commands import launch, mp_train
from d2l_multi.distributed import (
    assert_device_counts,
    detect_cluster,
    global_batch,
    launcher_settings,
)

PY = sys.executable


class Job:
    """A launcher subprocess whose merged output is read line by line in the background."""

    def __init__(self, launcher_args, command, **env):
        env = dict(os.environ, D2L_MULTI_SMOKE="1", MPLBACKEND="Agg", **env)
        self.proc = subprocess.Popen(
            [PY, "-m", "d2l_multi", "launch", *launcher_args, "--", *command], env=env,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines, self._queue = [], queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, text, timeout, count=1):
        """Return the first ``count`` output lines (so far or to come) containing ``text``;
        fail after ``timeout`` s. Returns the line itself when ``count`` is 1."""
        deadline = time.monotonic() + timeout
        found = [line for line in self.lines if text in line]
        while len(found) < count and time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=0.2)
            except queue.Empty:
                continue
            if line is None:
                break
            self.lines.append(line)
            if text in line:
                found.append(line)
        if len(found) < count:
            raise AssertionError(f"not {count} line(s) with {text!r} within {timeout} s:\n"
                                 + self.output)
        return found[0] if count == 1 else found[:count]

    def finish(self, timeout):
        """Wait for the launcher to exit; return its exit status."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"the launcher did not exit within {timeout} s:\n"
                                 + self.output) from None
        while (line := self._queue.get(timeout=5)) is not None:
            self.lines.append(line)
        return code

    @property
    def output(self):
        return "\n".join(self.lines)


def worker_pids(job):
    """{'p0': pid, ...} from the launcher's 'started p0 (pid 123), ...' line."""
    line = job.wait_for("[launch] started", timeout=30)
    parts = line.split("started ", 1)[1].split(", ")
    return {p.split()[0]: int(p.split("pid ")[1].rstrip(")")) for p in parts}


def alive(pid):
    """True while ``pid`` is a running (not zombie) process."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def snapshot(directory):
    """Every path under ``directory`` with its size and modification time."""
    root = pathlib.Path(directory)
    return {str(p): (p.stat().st_size, p.stat().st_mtime_ns)
            for p in [root, *sorted(root.rglob("*"))]}


# initialize_distributed, exit_worker, process_batches


def test_launcher_settings_checks_process_id():
    env = launch.job_env(1, 2, 4, 1234)
    with pytest.raises(ValueError, match="PROCESS_ID=2 but the job has only 2 processes"):
        launcher_settings({**env, "D2L_MULTI_PROCESS_ID": "2"})
    with pytest.raises(ValueError, match="NUM_PROCESSES='two' is not an integer"):
        launcher_settings({**env, "D2L_MULTI_NUM_PROCESSES": "two"})
    with pytest.raises(ValueError, match="D2L_MULTI_JOB_SECRET is missing or malformed"):
        launcher_settings({**env, "D2L_MULTI_JOB_SECRET": "guess"})
    assert launcher_settings(env)["process_id"] == 1
    assert launcher_settings({}) is None


def dead_pid():
    """The id of a process that has ended."""
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_settings_left_over_from_another_launch_are_refused_at_once():
    """D2L_MULTI_* settings left in a shell: a lone run says so instead of waiting for a
    coordinator that never comes (and aborting with a C++ trace)."""
    env = {**os.environ, **launch.job_env(1, 2, 1, launch.free_port()),
           "D2L_MULTI_LAUNCHER_PID": str(dead_pid())}
    result = subprocess.run([PY, "-m", "d2l_multi.mp_train", *MP], capture_output=True,
                            text=True, env=env, timeout=50)  # JAX would wait 60 s
    assert result.returncode == 2, result.stderr
    assert "come from a launch (launcher pid" in result.stderr
    assert "that did not start this process; unset them to run alone" in result.stderr
    assert "Traceback" not in result.stderr and result.stderr.count("\n") == 1


def test_detect_cluster():
    slurm = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_NTASKS": "2",
             "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}
    assert detect_cluster(slurm) == "slurm"
    assert detect_cluster({**slurm, "SLURM_NTASKS": "1"}) is None  # one task: alone
    assert detect_cluster({"OMPI_MCA_orte_hnp_uri": "x", "OMPI_COMM_WORLD_SIZE": "4"}) \
        == "ompi"
    assert detect_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}) is None  # a pod
    assert detect_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1",
                               "JOB_COMPLETION_INDEX": "0"}) == "k8s"
    assert detect_cluster({}) is None


def test_a_cloud_tpu_vm_is_told_by_libtpu_and_its_device_files(tmp_path, monkeypatch):
    """No private JAX module: libtpu installed and /dev/accel* or /dev/vfio/N present."""
    import importlib.util

    from d2l_multi import distributed
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: object() if name == "libtpu" else find_spec(name, *a))
    assert not distributed._on_cloud_tpu_vm(tmp_path)            # libtpu, but no chips
    (tmp_path / "vfio").mkdir()
    (tmp_path / "vfio" / "vfio").touch()                           # the control file only
    assert not distributed._on_cloud_tpu_vm(tmp_path)
    (tmp_path / "vfio" / "0").touch()
    assert distributed._on_cloud_tpu_vm(tmp_path)
    (tmp_path / "vfio" / "0").unlink()
    (tmp_path / "accel0").touch()
    assert distributed._on_cloud_tpu_vm(tmp_path)
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    assert not distributed._on_cloud_tpu_vm(tmp_path)             # chips, but no runtime
    assert detect_cluster() is None                            # this machine


def test_no_private_jax_module_is_imported():
    import d2l_multi
    root = pathlib.Path(d2l_multi.__file__).parent
    for path in sorted(root.glob("*.py")):
        assert "jax._src" not in path.read_text(), f"{path.name} imports from jax._src"


def test_alone_is_a_no_op(monkeypatch):
    for name in ["D2L_MULTI_COORDINATOR_ADDRESS", "SLURM_JOB_ID", "OMPI_MCA_orte_hnp_uri",
                 "KUBERNETES_SERVICE_HOST", "TPU_WORKER_HOSTNAMES"]:
        monkeypatch.delenv(name, raising=False)
    assert d2l.initialize_distributed() == (0, 1)
    assert not jax.distributed.is_initialized()


@pytest.mark.parametrize("kwargs,message", [
    (dict(heartbeat_timeout=0), "heartbeat_timeout must be a whole number of seconds >= 1"),
    (dict(heartbeat_timeout="10"), "heartbeat_timeout must be a whole number of seconds"),
    (dict(collective_timeout=-1), "collective_timeout must be a whole number of seconds"),
    (dict(collective_timeout=2.5), "collective_timeout must be a whole number of seconds"),
])
def test_initialize_distributed_checks_its_arguments(kwargs, message):
    with pytest.raises(ValueError, match=message):
        d2l.initialize_distributed(**kwargs)


@pytest.mark.parametrize("status", [-1, 256, 1.0, "1", True])
def test_exit_worker_checks_the_status(status):
    with pytest.raises(ValueError, match="status must be an exit status from 0 to 255"):
        d2l.exit_worker(status)


def test_exit_worker_ends_a_failure_at_once():
    """Success exits normally; a failure does not wait for a thread left waiting (as Orbax's
    are after a failed save), alone or in a job."""
    with pytest.raises(SystemExit) as e:
        d2l.exit_worker(0)
    assert e.value.code == 0
    waiting = ("import threading, d2l_multi as d2l\n"
               "threading.Thread(target=threading.Event().wait).start()\n"
               "d2l.exit_worker(3)")
    assert subprocess.run([PY, "-c", waiting], timeout=60).returncode == 3


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


@pytest.mark.parametrize("call,message", [
    (lambda: list(d2l.process_batches(np.zeros(4), np.zeros(3), 2)),
     "X has 4 examples but y has 3 labels"),
    (lambda: list(d2l.process_batches(np.zeros(4), np.zeros(4, np.int32), 0)),
     "batch_size must be a positive integer, got 0"),
    (lambda: list(d2l.process_batches(np.zeros(4), np.zeros(4, np.int32), 2, epoch=-1)),
     "epoch must be a non-negative integer, got -1"),
    (lambda: list(d2l.process_batches(np.zeros(4), np.zeros(4, np.int32), 2, seed=1.5)),
     "seed must be a non-negative integer, got 1.5"),
    (lambda: global_batch("mesh", np.zeros(8)), "mesh must be a jax.sharding.Mesh"),
    (lambda: global_batch(d2l.device_mesh()), "pass the arrays to assemble"),
    (lambda: assert_device_counts(0), "devices_per_process must be a positive integer"),
    (lambda: launch.job_env(2, 2, 4, 1234), "process_id must be a whole number from 0 to 1"),
    (lambda: launch.job_env(0, 2, 0, 1234), "devices_per_process must be a whole number"),
    (lambda: launch.job_env(0, 2, 4, 0), "port must be a whole number from 1 to 65535"),
    (lambda: launch.worker_env(0, 2, 2, 1234, heartbeat_timeout=0),
     "heartbeat_timeout must be a whole number at least 1"),
])
def test_distributed_functions_refuse_bad_arguments(call, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        call()


WAIT_FOREVER = """
import time, d2l_multi as d2l
d2l.initialize_distributed()
import jax, jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P
mesh = jax.make_mesh((jax.device_count(),), ('d',), axis_types=(jax.sharding.AxisType.Auto,))
total = jax.jit(jnp.sum, out_shardings=NamedSharding(mesh, P()))
x = jax.make_array_from_process_local_data(NamedSharding(mesh, P('d')), jnp.ones(2))
print('ready', float(total(x)), flush=True)
time.sleep(600)  # no collective in flight: only the heartbeat can end the survivor
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
        code = procs[0].wait(timeout=90)  # JAX's default heartbeat timeout is 100 s
        output = procs[0].stdout.read()
        assert code == -signal.SIGABRT, output[-2000:]  # JAX's fatal error: abort()
        assert "another task died" in output or "heartbeat" in output, output[-2000:]
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_mismatched_device_counts():
    """A process with fewer devices than the others is refused by every process."""
    worker = ('if [ "$D2L_MULTI_PROCESS_ID" = 1 ]; then export '
              'D2L_MULTI_DEVICES_PER_PROCESS=2; fi; exec "$0" -c '
              '"import d2l_multi as d2l; d2l.initialize_distributed()"')
    job = Job(["-n", "2", "--devices-per-process", "4"], ["sh", "-c", worker, PY])
    assert job.finish(timeout=40) == 1, job.output
    assert "InputError: every process should have 4 device(s), but process 0: 4, process 1: 2" \
        in job.output
    assert "--devices-per-process" in job.output


RAISE_WHILE_PEER_SLEEPS = """
import time, d2l_multi as d2l
process, _ = d2l.initialize_distributed()
print("joined", flush=True)
if process == 1:
    raise RuntimeError("the gloo context could not be set up")
time.sleep(600)
"""


def test_a_worker_that_raises_ends_the_job_while_its_peer_sleeps():
    """p1 raises after joining while p0 sleeps: p1 exits at once (instead of waiting in JAX's
    shutdown barrier for p0) and the launcher stops p0."""
    job = Job(["-n", "2", "--grace-period", "1"], [PY, "-c", RAISE_WHILE_PEER_SLEEPS])
    job.wait_for("[p1] joined", timeout=60)
    assert job.finish(timeout=90) == 1, job.output  # JAX's shutdown barrier would wait 120 s
    assert "RuntimeError: the gloo context could not be set up" in job.output
    assert "FAILED: worker p1 died first (exit code 1)" in job.output
    assert "p0 (pid" in job.output and "stopped by the launcher" in job.output


HANG_BEFORE_A_COLLECTIVE = """
import time, numpy as np, d2l_multi as d2l
process, _ = d2l.initialize_distributed()
from jax.experimental import multihost_utils
print("joined", flush=True)
if process == 1:
    time.sleep(600)  # stuck in its own code: never reaches the collective
multihost_utils.process_allgather(np.ones(3))
"""


def test_a_hung_worker_is_named_not_the_one_that_gave_up_waiting_for_it():
    """p0's collective times out waiting for p1, which hangs: the report names p1, and the C++
    stack of p1's abort is one line."""
    job = Job(["-n", "2", "--collective-timeout", "10", "--grace-period", "1"],
              [PY, "-c", HANG_BEFORE_A_COLLECTIVE])
    assert job.finish(timeout=150) == 1, job.output
    assert re.search(r"FAILED: p1 \(pid \d+\) stopped responding \(silent for \d+ s when p0 "
                     r"gave up: .*[Tt]ime.*\); p0 ended waiting for it", job.output), job.output
    assert not re.search(r"^\[p\d\]\s+@\s+0x", job.output, re.M), job.output


# the launcher


def test_a_port_below_1024_needs_root_not_another_port(capsys, monkeypatch):
    class Unprivileged(socket.socket):
        def bind(self, address):
            raise PermissionError(13, "Permission denied")
    monkeypatch.setattr(launch.socket, "socket", Unprivileged)
    assert commands.main(["launch", "--port", "80", "--", PY, "-c", "pass"]) == 2
    err = capsys.readouterr().err
    assert "--port 80: ports below 1024 need root" in err and "in use" not in err, err


def test_port_in_use(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        code = commands.main(["launch", "--port", str(port), "--", PY, "-c", "pass"])
    assert code == 2
    err = capsys.readouterr().err
    assert f"port {port} on 127.0.0.1 is already in use" in err and "--port" in err


OK = ["--", PY, "-c", "pass"]  # a command that would run


@pytest.mark.parametrize("argv,status,message", [
    (["--processes", "0", *OK], 2, "--processes must be a whole number from 1 to 64, got 0"),
    (["-n", "-3", *OK], 2, "--processes must be a whole number from 1 to 64, got -3"),
    (["-n", "65", *OK], 2, "--processes must be a whole number from 1 to 64, got 65"),
    (["-n", "two", *OK], 2, "argument --processes/-n: invalid int value: 'two'"),
    (["--devices-per-process", "0", *OK], 2,
     "--devices-per-process must be a whole number at least 1, got 0"),
    (["--heartbeat-timeout", "0", *OK], 2, "--heartbeat-timeout must be a whole number at least 1"),
    (["--collective-timeout", "-5", *OK], 2, "--collective-timeout must be a whole number at"),
    (["--grace-period", "-1", *OK], 2, "--grace-period must be a finite number of seconds >= 0, "
                                       "got -1.0"),
    (["--grace-period", "nan", *OK], 2, "--grace-period must be a finite number of seconds"),
    (["--grace-period", "inf", *OK], 2, "--grace-period must be a finite number of seconds"),
    (["--timeout", "0", *OK], 2, "--timeout must be a finite number of seconds > 0, got 0.0"),
    (["--timeout", "nan", *OK], 2, "--timeout must be a finite number of seconds > 0, got nan"),
    (["--timeout", "-3", *OK], 2, "--timeout must be a finite number of seconds > 0"),
    (["--port", "0", *OK], 2, "--port 0 is not a TCP port; use 1..65535"),
    (["--port", "70000", *OK], 2, "--port 70000 is not a TCP port; use 1..65535"),
    (["--bogus", *OK], 2, "unrecognized arguments: --bogus"),
    (["-n", "2", "--"], 2, "no command to run; put it after '--'"),
    (["-n", "2"], 2, "no command to run; put it after '--'"),
    (["--", "no-such-program-d2l"], 127, "cannot find the program 'no-such-program-d2l'"),
    (["--", "no_such_script.py"], 127, "no Python script 'no_such_script.py'"),
])
def test_launch_refuses_bad_arguments_before_starting_anything(capsys, argv, status, message):
    assert commands.main(["launch", *argv]) == status
    err = capsys.readouterr().err
    assert message in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err


@pytest.mark.parametrize("kwargs,message", [
    (dict(processes=0), "--processes must be a whole number from 1 to 64, got 0"),
    (dict(processes=2.0), "--processes must be a whole number from 1 to 64, got 2.0"),
    (dict(devices_per_process=True), "--devices-per-process must be a whole number"),
    (dict(timeout=float("inf")), "--timeout must be a finite number of seconds > 0, got inf"),
    (dict(grace_period="2"), "--grace-period must be a finite number of seconds >= 0"),
    (dict(command=[]), "no command to run"),
])
def test_launch_run_checks_its_arguments(kwargs, message):
    settings = {"command": [PY, "-c", "pass"], "processes": 1, "devices_per_process": 1,
                **kwargs}
    with pytest.raises(launch.LaunchError, match=message):
        launch.run(**settings)
    assert issubclass(launch.LaunchError, ValueError)


def test_workers_and_their_children_die_with_the_launcher():
    """Even a launcher killed with SIGKILL leaves no worker, nor a worker's child, behind."""
    job = Job(["-n", "2"], ["sh", "-c", 'sleep 60 & echo "child $!"; wait'])
    pids = set(worker_pids(job).values())
    pids |= {int(line.split("child ")[1]) for line in job.wait_for("] child ", 20, count=2)}
    assert len(pids) == 4 and all(alive(pid) for pid in pids)
    job.proc.kill()
    job.proc.wait(timeout=10)
    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in pids) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(alive(pid) for pid in pids)


def test_a_finished_worker_s_leftover_child_does_not_hang_the_launcher():
    """A worker exits 0 but its child keeps the output pipe open: the launcher kills the child
    after the grace period, says so, and exits 0."""
    job = Job(["-n", "1", "--grace-period", "0.5"], ["sh", "-c", 'sleep 60 & echo "child $!"'])
    child = int(job.wait_for("[p0] child ", timeout=20).split("child ")[1])
    assert job.finish(timeout=20) == 0, job.output
    assert "p0 (pid" in job.output and "left processes running in its process group; " \
                                         "killing them" in job.output
    assert "all 1 worker(s) finished OK" in job.output
    deadline = time.monotonic() + 5
    while alive(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not alive(child)


SLOW_START = ('echo initialising; if [ "$D2L_MULTI_PROCESS_ID" = 1 ]; then sleep 1; '
              'echo "step 1"; fi; exec sleep 60')


def test_timeout_stops_the_job_and_names_the_worker_it_waits_on():
    job = Job(["-n", "2", "--timeout", "3", "--grace-period", "0.5"], ["sh", "-c", SLOW_START])
    pids = worker_pids(job)
    assert job.finish(timeout=60) == launch.TIMEOUT_STATUS, job.output  # the workers sleep 60 s
    out = job.output
    assert "timed out: the job did not finish within --timeout 3 s; still running: p0" in out
    assert "p0 (pid" in out and "last printed" in out and "'initialising'" in out
    assert "'step 1'" in out
    assert "the job waits on p0" in out and "FAILED: stopped by --timeout 3 s" in out
    assert not any(alive(pid) for pid in pids.values())


def listening(port):
    """The local addresses that listen on TCP ``port`` (read from /proc/net/tcp and tcp6)."""
    found = []
    for table in ("tcp", "tcp6"):
        path = pathlib.Path("/proc/net") / table
        if not path.exists():
            continue
        for line in path.read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            address, hexport = local.rsplit(":", 1)
            if state == "0A" and int(hexport, 16) == port:  # 0A: LISTEN
                raw = b"".join(bytes.fromhex(address[i:i + 8])[::-1]
                               for i in range(0, len(address), 8))
                address = ipaddress.ip_address(raw)
                found.append(getattr(address, "ipv4_mapped", None) or address)
    return found


JOIN_AND_WAIT = """
import time, d2l_multi as d2l
d2l.initialize_distributed()
print('joined', flush=True)
time.sleep(600)
"""


@pytest.mark.skipif(not pathlib.Path("/proc/net/tcp").exists(), reason="needs /proc/net")
def test_the_coordinator_listens_on_loopback_only():
    job = Job(["-n", "2"], [PY, "-c", JOIN_AND_WAIT])
    port = int(re.search(r"coordinator 127\.0\.0\.1:(\d+)", job.wait_for("coordinator", 30))[1])
    pids = worker_pids(job)
    job.wait_for("joined", timeout=90, count=2)
    addresses = listening(port)
    job.proc.send_signal(signal.SIGINT)
    assert job.finish(timeout=60) == 128 + signal.SIGINT, job.output
    assert addresses and all(a.is_loopback for a in addresses), addresses
    assert not any(alive(pid) for pid in pids.values())


INTRUDED = """
import d2l_multi as d2l
d2l.initialize_distributed()
import jax, jax.numpy as jnp
from jax.experimental import multihost_utils
print('sum', multihost_utils.process_allgather(jnp.ones(2)).sum(), flush=True)
"""


def test_a_program_this_launch_did_not_start_cannot_join():
    """p1 is slow to start; a program with copied D2L_MULTI_* settings (but not the launch's
    secret) joins as process 1 first: process 0 stops before any data moves."""
    late_p1 = ('if [ "$D2L_MULTI_PROCESS_ID" = 1 ]; then sleep 120; fi; '
               'exec "$0" -c "$1"')
    job = Job(["-n", "2", "--grace-period", "0.5"], ["sh", "-c", late_p1, PY, INTRUDED])
    port = int(re.search(r"coordinator 127\.0\.0\.1:(\d+)", job.wait_for("coordinator", 30))[1])
    pids = worker_pids(job)
    intruder = subprocess.run(
        [PY, "-c", INTRUDED], env=dict(os.environ, **launch.job_env(1, 2, 1, port)),
        capture_output=True, text=True, timeout=120)
    assert job.finish(timeout=60) == 1, job.output
    assert "[p0] d2l_multi.errors.NoAccessError: process 1 did not show this launch's secret: " \
           "a program " \
           "that this launch did not start joined the job as process 1" in job.output
    assert "FAILED: worker p0 died first (exit code 1)" in job.output
    assert "] sum" not in job.output and "sum" not in intruder.stdout
    assert intruder.returncode != 0
    assert not any(alive(pid) for pid in pids.values())


IGNORE_TERM = ("import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
               "print('ready', flush=True); time.sleep(600)")


@pytest.mark.parametrize("signals", [(signal.SIGINT, signal.SIGINT), (signal.SIGTERM,),
                                     (signal.SIGTERM, signal.SIGTERM),
                                     (signal.SIGHUP, signal.SIGHUP)],
                         ids=["two SIGINT", "SIGTERM", "two SIGTERM", "two SIGHUP"])
def test_signals_to_the_launcher_leave_no_worker_alive(signals):
    """Workers ignore SIGTERM (JAX workers do); a second signal during the clean-up must not
    cut it short: when the launcher exits, no worker is left, and it says what it did."""
    job = Job(["-n", "2", "--grace-period", "5"], [PY, "-c", IGNORE_TERM])
    pids = worker_pids(job)
    job.wait_for("ready", timeout=30, count=2)
    for sig in signals:
        job.proc.send_signal(sig)
        time.sleep(0.2)
    assert job.finish(timeout=60) == 128 + signals[0], job.output
    assert not any(alive(pid) for pid in pids.values()), job.output
    name = signal.Signals(signals[0]).name
    assert f"interrupted by {name}: stopping the workers" in job.output
    assert "stopped all 2 worker(s)" in job.output and "Traceback" not in job.output


def test_a_signal_during_the_timeout_s_grace_period_ends_it():
    job = Job(["-n", "1", "--timeout", "2", "--grace-period", "300"], [PY, "-c", IGNORE_TERM])
    pids = worker_pids(job)
    job.wait_for("timed out", timeout=60)
    job.proc.send_signal(signal.SIGINT)
    assert job.finish(timeout=120) == launch.TIMEOUT_STATUS, job.output  # not 300 s
    assert not any(alive(pid) for pid in pids.values())


CHATTY = "import itertools\nfor i in itertools.count():\n    print('line', i, flush=True)"


def test_a_reader_that_goes_away_stops_the_job():
    """``launch ... | head -1``: the launcher stops the workers instead of hanging."""
    proc = subprocess.Popen([PY, "-m", "d2l_multi", "launch", "-n", "2", "--", PY, "-c", CHATTY],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().startswith("[p")
    proc.stdout.close()
    try:
        code = proc.wait(timeout=60)
    finally:
        proc.kill()
    err = proc.stderr.read()
    assert code == 128 + signal.SIGPIPE, err
    assert "the reader of the output has gone" in err and "Traceback" not in err, err
    pids = [int(p) for p in re.findall(r"pid (\d+)", err.split("started ", 1)[1].splitlines()[0])]
    assert len(pids) == 2 and not any(alive(pid) for pid in pids)


def test_a_stopped_worker_is_named_as_the_cause():
    """p1 stopped with SIGSTOP sends no heartbeat; p0 is aborted by JAX for it: the report
    names the stop, not only p0's abort."""
    job = Job(["-n", "2", "--heartbeat-timeout", "3", "--grace-period", "1"],
              [PY, "-c", JOIN_AND_WAIT])
    pids = worker_pids(job)
    job.wait_for("joined", timeout=90, count=2)
    os.kill(pids["p1"], signal.SIGSTOP)
    assert job.finish(timeout=120) != 0, job.output
    assert "after p1 had been stopped (SIGSTOP or Ctrl-Z): a stopped worker sends no " \
           "heartbeat, so its peers count it dead" in job.output
    assert not any(alive(pid) for pid in pids.values())


def test_the_command_s_own_double_dash_stays_with_it():
    assert launch.split_command(["-n", "2", "python", "w.py", "--", "--x"]) == (
        ["-n", "2"], ["python", "w.py", "--", "--x"])
    assert launch.split_command(["-n", "2", "--", "python", "w.py", "--", "--x"]) == (
        ["-n", "2"], ["python", "w.py", "--", "--x"])
    assert launch.split_command(["--port", "9", "w.py"]) == (["--port", "9"], ["w.py"])


@pytest.mark.parametrize("process_id,devices,gpus,ok", [
    (0, 1, None, True), (1, 4, 8, True), (2, 4, 8, False), (1, 1, 1, False), (3, 2, 0, True)])
def test_gpu_ids_are_checked_against_the_gpus_present(process_id, devices, gpus, ok):
    from d2l_multi import distributed
    if ok:
        distributed._check_gpu_ids(process_id, devices, gpus)
        return
    last = (process_id + 1) * devices
    with pytest.raises(ValueError, match=rf"process {process_id} would use GPUs "
                                         rf"{last - devices}..{last - 1}, but this machine "
                                         rf"has {gpus} GPU\(s\)"):
        distributed._check_gpu_ids(process_id, devices, gpus)


def test_the_gpus_present_are_counted_from_the_driver(tmp_path):
    from d2l_multi import distributed
    assert distributed._gpus_here({}, str(tmp_path / "none")) is None
    for i in range(4):
        (tmp_path / f"0000:0{i}:00.0").mkdir()
    assert distributed._gpus_here({}, str(tmp_path)) == 4
    assert distributed._gpus_here({"CUDA_VISIBLE_DEVICES": "1,3"}, str(tmp_path)) == 2


@pytest.mark.parametrize("gpus,environ,expected", [
    (1, {}, {"JAX_PLATFORMS": "cpu"}),            # Colab's one GPU, 2 x 4 devices asked for
    (7, {}, {"JAX_PLATFORMS": "cpu"}),
    (8, {}, {}),                                  # enough GPUs: worker p gets GPUs p*4..
    (None, {}, {}), (0, {}, {}),                  # no NVIDIA driver, or no GPU visible
    (1, {"JAX_PLATFORMS": "cuda"}, {}),           # the reader's choice is kept
])
def test_workers_simulate_cpu_devices_where_gpus_are_too_few(gpus, environ, expected):
    assert launch.cpu_fallback(8, environ, gpus) == expected


def test_the_launcher_gives_the_fallback_to_every_worker(monkeypatch, capsys):
    from d2l_multi import distributed
    monkeypatch.delenv("JAX_PLATFORMS", raising=False)
    monkeypatch.setattr(distributed, "_gpus_here", lambda environ=None: 1)
    check = "import os, sys; sys.exit(os.environ.get('JAX_PLATFORMS') != 'cpu')"
    assert launch.run([PY, "-c", check], 2, 4, timeout=60) == 0
    assert "fewer GPUs than the 8 devices asked for" in capsys.readouterr().err
    assert launch.worker_env(1, 2, 1, 1234)["JAX_PLATFORMS"] == "cpu"  # 2 devices, 1 GPU
    monkeypatch.setattr(distributed, "_gpus_here", lambda environ=None: 2)
    assert "JAX_PLATFORMS" not in launch.worker_env(1, 2, 1, 1234)


def test_gloo_chatter_is_dropped():
    chatter = "Expected number of connected peer ranks is : 7"
    assert launch.drop_gloo_chatter(f"[Gloo] Rank 3 is connected to 7 peer ranks. {chatter}") \
        == ""
    assert launch.drop_gloo_chatter(f"7 is connected to 7 peer ranks. {chatter}") == ""
    assert launch.drop_gloo_chatter("0 is connected to ") == ""
    assert launch.drop_gloo_chatter("epoch 1: loss [Gloo] Rank ") == "epoch 1: loss "
    assert launch.drop_gloo_chatter("epoch 1: loss 2.3") == "epoch 1: loss 2.3"


# mp_train


# 256 examples in global batches of 64: 4 steps per epoch, 8 in all; checkpoints at 3, 6, 8
MP = ["--num-train", "256", "--num-val", "64", "--batch-size", "64", "--epochs", "2",
      "--save-every", "3"]


def parse(argv):
    return mp_train.parser().parse_args([str(a) for a in argv])


@pytest.fixture(scope="module")
def uninterrupted():
    """The reference: mp_train's 8 steps without a break, here (1 process x 8 devices)."""
    assert jax.process_count() == 1 and jax.device_count() == 8
    params, history = mp_train.train(parse(MP))
    assert [row["steps"] for row in history] == [4, 8]
    return [np.asarray(p) for p in params]


@pytest.fixture(scope="module")
def resumed(tmp_path_factory):
    """mp_train stopped mid-epoch by --steps 5 (checkpoints at 3 and 5), then resumed."""
    out = tmp_path_factory.mktemp("resumed")
    args = [*MP, "--out", out]
    _, first = mp_train.train(parse([*args, "--steps", 5]))
    steps_after_stop = d2l.saved_steps(out / "checkpoints")
    params, second = mp_train.train(parse([*args, "--resume"]))
    return dict(out=out, args=args, first=first, steps_after_stop=steps_after_stop,
                params=[np.asarray(p) for p in params], second=second)


def test_one_process_resumes_exactly_where_it_stopped(resumed, uninterrupted):
    """The resumed run ends with the parameters of the uninterrupted one, bit for bit (the
    same mesh, the same batches in the same order)."""
    assert [row["steps"] for row in resumed["first"]] == [4, 5]
    assert resumed["steps_after_stop"] == [3, 5]
    assert [(row["epoch"], row["steps"]) for row in resumed["second"]] == [(2, 8)]
    for a, b in zip(resumed["params"], uninterrupted):
        np.testing.assert_array_equal(a, b)
    log = json.loads((resumed["out"] / "log.json").read_text())
    assert [(row["epoch"], row["steps"]) for row in log] == [(1, 4), (2, 5), (2, 8)]
    saved = np.load(resumed["out"] / "params.npz")
    for i, b in enumerate(uninterrupted):
        np.testing.assert_array_equal(saved[f"arr_{i}"], b)


def test_two_processes_crash_resume_and_match_one_process(tmp_path, uninterrupted):
    """2 processes x 4 devices: p1 dies at step 4, the launcher stops p0 at once and leaves no
    process; the checkpoint of step 3 resumes mid-epoch, and the run ends with the parameters
    of the uninterrupted 1 x 8 run (up to the order of sums)."""
    args = [PY, "-m", "d2l_multi.mp_train", *MP, "--out", str(tmp_path)]
    job = Job(["-n", "2", "--devices-per-process", "4", "--grace-period", "2"],
              [*args, "--crash-at-step", "4"])
    pids = worker_pids(job)
    job.wait_for("crashing on purpose at step 4", timeout=150)
    code = job.finish(timeout=90)  # p0 would wait 120 s in its next collective
    assert code == 128 + signal.SIGKILL, job.output
    assert "FAILED: worker p1 died first (killed by SIGKILL)" in job.output
    assert "process 1 of 2: 4 local cpu devices of 8" in job.output
    assert not any(alive(pid) for pid in pids.values()), job.output
    assert d2l.saved_steps(tmp_path / "checkpoints") == [3]  # 6 was never reached
    job = Job(["-n", "2", "--devices-per-process", "4"], [*args, "--resume"])
    assert job.finish(timeout=150) == 0, job.output
    assert "resumed from the checkpoint of step 3 (epoch 1, batch 3 of 4)" in job.output
    multi = np.load(tmp_path / "params.npz")
    multi = [multi[f"arr_{i}"] for i in range(len(multi.files))]
    assert_trees_close(multi, uninterrupted, dict(rtol=1e-4, atol=1e-6))
    # the checkpoint the two processes wrote together restores in this one process
    assert d2l.saved_steps(tmp_path / "checkpoints") == [6, 8]
    state = d2l.restore_checkpoint(tmp_path / "checkpoints",
                                   mp_train.abstract_state(mp_train.data_mesh()))
    assert int(state["step"]) == 8
    for a, b in zip(state["params"], multi):
        np.testing.assert_array_equal(np.asarray(a), b)


def test_resuming_refuses_checkpoints_of_another_run(resumed, capsys):
    """Checkpoints in --out without --resume, or written with other data sizes, or past the
    end of the run: refused, naming the fix, and nothing changes."""
    args, before = resumed["args"], snapshot(resumed["out"])
    for argv, message in [
            (args, "already holds checkpoints (steps [6, 8]); pass --resume to continue from "
                   "step 8, or another --out"),
            ([*args, "--resume", "--batch-size", "32"],
             "was written with --batch-size 64 (this run: 32), so its steps do not continue "
             "this run; resume with the settings it was written with, or pass another --out"),
            ([*args, "--resume", "--num-train", "1024"],
             "was written with training examples 256 (this run: 1024)"),
            ([*args, "--resume", "--lr", "0.1", "--seed", "3"],
             "was written with --seed 0 (this run: 3), --lr 0.2 (this run: 0.1)"),
            ([*args, "--resume", "--steps", "2"], "is of step 8, past the last step of this "
                                                  "run (2)")]:
        assert mp_train.main([str(a) for a in argv]) == 2
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err
    assert snapshot(resumed["out"]) == before


@pytest.mark.parametrize("damage,status,message", [
    ("metadata", 1, "8 is damaged: state/_METADATA is not valid JSON"),
    ("layouts", 1, "8 is damaged: state/_sharding is not valid JSON"),
    ("copy", 1, "12 holds the state of step 6, not of step 12: it was copied or renamed"),
    ("stray", 1, "holds the empty folder(s) 100, which no save wrote into"),
])
def test_a_checkpoint_folder_that_cannot_be_resumed_is_one_line_naming_the_fix(
        resumed, tmp_path, capsys, damage, status, message):
    out = tmp_path / "run"
    shutil.copytree(resumed["out"], out)
    checkpoints = out / "checkpoints"
    if damage in ("metadata", "layouts"):
        f = checkpoints / "8" / "state" / ("_METADATA" if damage == "metadata" else "_sharding")
        f.write_bytes(f.read_bytes()[:50])
    elif damage == "copy":
        shutil.copytree(checkpoints / "6", checkpoints / "12")
    else:
        (checkpoints / "100").mkdir()
    before = snapshot(out)
    assert mp_train.main([*MP, "--epochs", "30", "--out", str(out), "--resume"]) == status
    err = capsys.readouterr().err
    assert message in err, err
    if damage != "stray":
        latest = checkpoints / ("12" if damage == "copy" else "8")
        assert f"the latest checkpoint {latest} cannot be used (" in err
        assert f"delete that folder to resume from step {6 if damage != 'copy' else 8}" in err
    assert err.count("error:") == 1 and "Traceback" not in err, err
    assert snapshot(out) == before


def test_two_runs_on_one_out_are_refused(resumed, tmp_path, capsys):
    """Another run holds OUT/.lock: this one is refused instead of replacing its files."""
    out = tmp_path / "run"
    shutil.copytree(resumed["out"], out)
    before = snapshot(out)
    with open(out / ".lock", "a") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert mp_train.main([*MP, "--out", str(out), "--resume"]) == 1
    err = capsys.readouterr().err
    assert f"--out {out} is in use by another run; wait until it ends, or pass another " \
           f"--out" in err and "Traceback" not in err, err
    assert snapshot(out) == before


def test_a_corrupt_log_on_resume_is_refused_and_kept(resumed, tmp_path, capsys):
    out = tmp_path / "run"
    shutil.copytree(resumed["out"], out)
    (out / "log.json").write_text('[{"epoch": 1, "steps": 4')  # cut short
    before = snapshot(out)
    assert mp_train.main([*MP, "--epochs", "3", "--out", str(out), "--resume"]) == 1
    err = capsys.readouterr().err
    assert f"{out / 'log.json'} is not a log this program wrote" in err, err
    assert err.count("error:") == 1 and "epoch 3" not in err
    assert snapshot(out) == before


def test_a_folder_where_the_log_goes_is_refused_before_training(tmp_path, capsys):
    (tmp_path / "log.json").mkdir()
    assert mp_train.main([*MP, "--out", str(tmp_path)]) == 1
    out, err = capsys.readouterr()
    assert f"{tmp_path / 'log.json'} is a folder, where the run writes its file log.json" \
        in err and "epoch" not in out, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["log.json"]


def test_a_checkpoint_folder_whose_path_is_too_long_is_refused(tmp_path):
    """A path too long for the checkpoint's files: one message and exit 1 before any save
    (a save would fail in Orbax's threads and leave the others waiting)."""
    length = 4040 - len(str(tmp_path))  # PATH_MAX is 4096: the checkpoint's files go past it
    out = tmp_path.joinpath(*["d" * 200] * (length // 201), "e" * (length % 201 - 1))
    assert len(str(out)) == 4040
    result = subprocess.run([PY, "-m", "d2l_multi.mp_train", *MP, "--out", str(out)],
                            capture_output=True, text=True, timeout=240)
    assert result.returncode == 1, result.stderr[-3000:]
    assert result.stderr.count("error:") == 1, result.stderr[-3000:]
    assert "the path of the checkpoint folder is 4052 characters long, and its files need " \
           "about 160 more, past this system's limit of 4096; pass a shorter path" \
           in result.stderr and "Traceback" not in result.stderr


def small_files(*command):
    """``command`` where files may not grow past 100 kB, as on a full disk (a write past it
    fails: SIGXFSZ is ignored)."""
    return ["sh", "-c", 'trap "" XFSZ; ulimit -f 200; exec "$@"', "sh", *command]


def test_a_full_disk_is_one_line_and_status_1(tmp_path):
    """The save fails in Orbax's threads; the run says so in one line with status 1 (not 2,
    a bad argument)."""
    result = subprocess.run(small_files(PY, "-m", "d2l_multi.mp_train", *MP, "--out",
                                        str(tmp_path)), capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 1, result.stderr[-3000:]
    assert "error: saving a checkpoint into" in result.stderr
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert d2l.saved_steps(tmp_path / "checkpoints") == []


def test_a_failed_save_in_a_job_ends_it_within_the_collective_timeout(tmp_path):
    """Both processes fail to write while Orbax's threads wait for each other: the waits end
    after --collective-timeout, each process says why in one line, the job exits 1."""
    result = subprocess.run(small_files(PY, "-m", "d2l_multi", "launch", "-n", "2",
                                        "--collective-timeout", "20", "--timeout", "240", "--",
                                        PY, "-m", "d2l_multi.mp_train", *MP, "--out",
                                        str(tmp_path)), capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 1, result.stderr[-3000:]
    assert re.search(r"\[p[01]\] python -m d2l_multi.mp_train: error: saving a checkpoint "
                     r"into", result.stdout), result.stdout[-3000:]
    assert "FAILED: worker p" in result.stderr and "died first (exit code 1)" in result.stderr


LONG = ["--num-train", "256", "--num-val", "64", "--batch-size", "64", "--epochs", "1000"]


def test_sigterm_saves_a_checkpoint_and_ends_the_run(tmp_path):
    """A preemption notice (SIGTERM) to a lone run: it saves the step it reached, says so
    and exits with 143; the checkpoint resumes."""
    proc = subprocess.Popen([PY, "-m", "d2l_multi.mp_train", *LONG, "--out", str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=dict(os.environ, D2L_MULTI_SMOKE="1"))
    try:
        line = proc.stdout.readline()
        while line and not line.startswith("epoch 1:"):
            line = proc.stdout.readline()
        proc.send_signal(signal.SIGTERM)
        output = line + proc.communicate(timeout=120)[0]
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, output
    step = int(re.search(r"SIGTERM \(a preemption notice\): saved the checkpoint of step "
                         r"(\d+); run again with --resume to continue", output)[1])
    assert d2l.saved_steps(tmp_path / "checkpoints")[-1] == step


def test_sigterm_to_one_worker_saves_the_same_step_in_every_process(tmp_path):
    job = Job(["-n", "2", "--grace-period", "30"],
              [PY, "-m", "d2l_multi.mp_train", *LONG, "--out", str(tmp_path)])
    pids = worker_pids(job)
    job.wait_for("[p0] epoch 1:", timeout=150)
    os.kill(pids["p0"], signal.SIGTERM)
    assert job.finish(timeout=150) == 128 + signal.SIGTERM, job.output
    saved = job.wait_for("saved the checkpoint of step", timeout=1, count=2)
    steps = {int(re.search(r"step (\d+);", line)[1]) for line in saved}
    assert len(steps) == 1 and d2l.saved_steps(tmp_path / "checkpoints")[-1] in steps, saved


def test_a_worker_whose_coordinator_port_is_taken_says_so(capsys):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = subprocess.run([PY, "-m", "d2l_multi.mp_train", *MP], capture_output=True,
                                env=launch.worker_env(0, 2, 1, port), text=True, timeout=90)
    assert result.returncode == 1, result.stderr
    assert (f"python -m d2l_multi.mp_train: error: process 0 could not start the coordinator "
            f"on 127.0.0.1:{port}: that port is in use") in result.stderr
    assert "Traceback" not in result.stderr


def test_resume_with_nothing_to_resume_says_so(tmp_path, capsys):
    assert mp_train.main([*MP, "--steps", "1", "--resume", "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert f"no checkpoint in {tmp_path / 'checkpoints'}: starting from step 0" in out
    assert d2l.saved_steps(tmp_path / "checkpoints") == [1]


@pytest.mark.parametrize("argv,status,message", [
    (["--epochs", "0"], 2, "argument --epochs: must be a finite number > 0, got 0"),
    (["--epochs", "-2"], 2, "argument --epochs: must be a finite number > 0, got -2"),
    (["--epochs", "ten"], 2, "argument --epochs: expected a whole number, got 'ten'"),
    (["--batch-size", "0"], 2, "argument --batch-size: must be a finite number > 0, got 0"),
    (["--batch-size", "100"], 2, "--batch-size 100 does not divide evenly over 8 devices (1 "
                                 "process(es)); use a multiple of 8, e.g. 96 or 104"),
    (["--num-train", "0"], 2, "argument --num-train: must be a finite number > 0, got 0"),
    (["--num-train", "60001"], 2, "--num-train 60001: Fashion-MNIST has only 60000 of those "
                                  "examples; pass at most 60000"),
    (["--num-val", "-1"], 2, "argument --num-val: must be a finite number > 0, got -1"),
    (["--num-val", "10001"], 2, "--num-val 10001: Fashion-MNIST has only 10000"),
    (["--num-train", "50"], 2, "50 training examples make less than one global batch of "
                               "--batch-size 64; pass a --batch-size of at most 50, or more "
                               "--num-train"),
    (["--steps", "0"], 2, "argument --steps: must be a finite number > 0, got 0"),
    (["--save-every", "-4"], 2, "argument --save-every: must be a finite number > 0, got -4"),
    (["--crash-at-step", "0"], 2, "argument --crash-at-step: must be a finite number > 0"),
    (["--crash-at-step", "9"], 2, "--crash-at-step 9 is after the last step of this run (8: "
                                  "2 epoch(s) of 4 steps, --steps None); pass a step from 1 "
                                  "to 8"),
    (["--steps", "3", "--crash-at-step", "4"], 2, "pass a step from 1 to 3"),
    (["--lr", "nan"], 2, "argument --lr: must be a finite number > 0, got nan"),
    (["--lr", "inf"], 2, "argument --lr: must be a finite number > 0, got inf"),
    (["--lr", "-0.1"], 2, "argument --lr: must be a finite number > 0, got -0.1"),
    (["--lr", "0"], 2, "argument --lr: must be a finite number > 0, got 0"),
    (["--resume"], 2, "--resume needs --out: the checkpoints are in OUT/checkpoints"),
    (["--out", "FILE"], 1, "--out FILE is a file, not a folder; pass a folder"),
    (["--out", "FILE/run"], 1, "is a file, not a folder; pass a folder"),
    (["--out", "/proc/d2l_multi_run"], 1, "cannot write into --out /proc/d2l_multi_run"),
    (["--bogus"], 2, "unrecognized arguments: --bogus (see python -m d2l_multi.mp_train "
                     "--help)"),
])
def test_mp_train_refuses_bad_values_at_once_writing_nothing(tmp_path, capsys, argv, status,
                                                             message):
    (tmp_path / "FILE").write_text("not a folder")
    before = snapshot(tmp_path)
    argv = [a.replace("FILE", str(tmp_path / "FILE")) for a in argv]
    message = message.replace("FILE", str(tmp_path / "FILE"))
    assert mp_train.main([*MP, *argv]) == status
    out, err = capsys.readouterr()
    assert "epoch" not in out  # refused before any training
    assert err.strip().splitlines()[-1].endswith(message) or message in err, err
    assert err.count("error:") == 1 and "Traceback" not in err, err
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("option,value", [("epochs", 0), ("lr", float("nan")),
                                          ("batch_size", 2.5), ("steps", True)])
def test_mp_train_train_checks_arguments_that_bypass_the_parser(option, value):
    args = parse(MP)
    setattr(args, option, value)
    with pytest.raises(ValueError, match=rf"--{option.replace('_', '-')} must be a .* > 0, "
                                         rf"got {value!r}"):
        mp_train.train(args)


def test_mp_train_command_prints_one_line_without_traceback():
    result = subprocess.run([PY, "-m", "d2l_multi.mp_train", "--epochs", "0"],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.strip() == ("python -m d2l_multi.mp_train: error: argument --epochs: "
                                     "must be a finite number > 0, got 0 (see python -m "
                                     "d2l_multi.mp_train --help)")


def test_a_diverging_run_stops_and_commits_no_non_finite_checkpoint(tmp_path, capsys,
                                                                      monkeypatch):
    import orbax.checkpoint as ocp
    opened, init, close = [], ocp.CheckpointManager.__init__, ocp.CheckpointManager.close

    def tracked_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        opened.append(self)

    def tracked_close(self):
        opened.remove(self)
        close(self)
    monkeypatch.setattr(ocp.CheckpointManager, "__init__", tracked_init)
    monkeypatch.setattr(ocp.CheckpointManager, "close", tracked_close)
    code = mp_train.main([*MP, "--lr", "1e30", "--save-every", "1", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "the loss became nan at step 2 (epoch 1) with --lr 1e+30; the learning rate is " \
           "too large: try a smaller one, e.g. --lr 0.2" in err and "Traceback" not in err
    assert opened == []  # every checkpoint manager was closed
    steps = d2l.saved_steps(tmp_path / "checkpoints")
    assert steps == [1]
    for step in steps:
        state = d2l.restore_checkpoint(tmp_path / "checkpoints",
                                       mp_train.abstract_state(mp_train.data_mesh()), step)
        check.finite(state)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".lock", "checkpoints"]


def test_damaged_data_under_the_launcher_is_one_line_per_worker(tmp_path):
    data = tmp_path / "fashion-mnist"
    data.mkdir()
    for name in ["train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz",
                 "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"]:
        (data / name).write_bytes(b"not gzip")
    job = Job(["-n", "2"], [PY, "-m", "d2l_multi.mp_train", *MP], D2L_MULTI_DATA=str(tmp_path))
    assert job.finish(timeout=90) == 1, job.output
    first = job.wait_for("died first (exit code 1)", timeout=1).split("worker ")[1].split()[0]
    errors = [line for line in job.lines if line.startswith(f"[{first}] ")]
    assert len(errors) == 1 and "cannot decompress" in errors[0], job.output
    assert errors[0].startswith(f"[{first}] python -m d2l_multi.mp_train: error: ")
    assert "Traceback" not in job.output
