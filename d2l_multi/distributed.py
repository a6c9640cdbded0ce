"""Several processes, one job: ``initialize_distributed`` and process-aware global batches.

A worker script calls ``initialize_distributed()`` before any other JAX code. Under
``python -m d2l_multi launch`` it reads the launcher's environment variables (``D2L_MULTI_*``);
on a cluster (SLURM, Open MPI, Kubernetes, Cloud TPU) it lets ``jax.distributed.initialize()``
detect the settings itself; alone on a laptop it does nothing. Importing this module does not
start JAX's backend.

A process that has joined a job must not linger after a failure: at exit JAX waits in a
shutdown barrier for every peer, minutes if one of them hangs or sleeps. So after joining, an
uncaught exception ends the process at once (``initialize_distributed`` installs that hook),
and a worker ends with ``exit_worker(status)``, which does the same for a failure status.
"""
import errno
import glob
import hmac
import importlib.util
import math
import os
import re
import socket
import sys

import jax
import numpy as np
from jax.typing import ArrayLike

from . import _checks as check
from .errors import InputError, NoAccessError, PathError
from .hardware import set_cpu_compiler_flags, size_cpu_thread_pool

# What the launcher (d2l_multi/launch.py) puts into every worker's environment.
COORDINATOR_ENV = "D2L_MULTI_COORDINATOR_ADDRESS"
NUM_PROCESSES_ENV = "D2L_MULTI_NUM_PROCESSES"
PROCESS_ID_ENV = "D2L_MULTI_PROCESS_ID"
DEVICES_PER_PROCESS_ENV = "D2L_MULTI_DEVICES_PER_PROCESS"
HEARTBEAT_TIMEOUT_ENV = "D2L_MULTI_HEARTBEAT_TIMEOUT"
COLLECTIVE_TIMEOUT_ENV = "D2L_MULTI_COLLECTIVE_TIMEOUT"
SECRET_ENV = "D2L_MULTI_JOB_SECRET"            # known only to the launch and its workers
LAUNCHER_PID_ENV = "D2L_MULTI_LAUNCHER_PID"    # the process that started the workers


def _env_int(name, minimum, env):
    """The integer in environment variable ``name`` (of mapping ``env``), at least ``minimum``."""
    text = env.get(name)
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise InputError(f"{name}={text!r} is not an integer; the launcher sets it "
                         f"(python -m d2l_multi launch ...), so do not edit it by hand") from None
    if value < minimum:
        raise InputError(f"{name}={value} must be at least {minimum}")
    return value


def _started_by(pid):
    """True if process ``pid`` is this process or an ancestor (without /proc: is running)."""
    if pid == os.getpid():
        return True
    if not os.path.isdir("/proc"):
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass
        return True
    ancestor = os.getppid()
    while ancestor > 1:
        if ancestor == pid:
            return True
        try:
            with open(f"/proc/{ancestor}/stat") as f:
                ancestor = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            return False
    return False


def launcher_settings(environ=None):
    """The settings ``python -m d2l_multi launch`` gave this process; None outside it.
    Settings left over from a launch that did not start this process are refused."""
    env = os.environ if environ is None else environ
    if not env.get(COORDINATOR_ENV):
        return None
    s = {"coordinator_address": env[COORDINATOR_ENV],
         "num_processes": _env_int(NUM_PROCESSES_ENV, 1, env),
         "process_id": _env_int(PROCESS_ID_ENV, 0, env),
         "devices_per_process": _env_int(DEVICES_PER_PROCESS_ENV, 1, env),
         "heartbeat_timeout": _env_int(HEARTBEAT_TIMEOUT_ENV, 1, env)
         if env.get(HEARTBEAT_TIMEOUT_ENV) else None,
         "collective_timeout": _env_int(COLLECTIVE_TIMEOUT_ENV, 1, env)
         if env.get(COLLECTIVE_TIMEOUT_ENV) else None,
         "secret": env.get(SECRET_ENV, ""),
         "launcher_pid": _env_int(LAUNCHER_PID_ENV, 1, env)}
    if not re.fullmatch(r"[\w.-]+:\d{1,5}|\[[0-9a-fA-F:.]+\]:\d{1,5}", s["coordinator_address"]):
        raise InputError(f"{COORDINATOR_ENV}={s['coordinator_address']!r} is not HOST:PORT; the "
                         f"launcher sets it (python -m d2l_multi launch ...), so do not edit it "
                         f"by hand")
    if s["process_id"] >= s["num_processes"]:
        raise InputError(f"{PROCESS_ID_ENV}={s['process_id']} but the job has only "
                         f"{s['num_processes']} processes (ids 0..{s['num_processes'] - 1})")
    if not re.fullmatch(r"[0-9a-f]{32}", s["secret"]):
        raise InputError(f"{SECRET_ENV} is missing or malformed; the launcher sets it "
                         f"(python -m d2l_multi launch ...), so do not edit it by hand")
    if not _started_by(s["launcher_pid"]):
        raise InputError(f"the D2L_MULTI_* settings in the environment come from a launch "
                         f"(launcher pid {s['launcher_pid']}) that did not start this process; "
                         f"unset them to run alone (unset ${{!D2L_MULTI_@}}), or start the job "
                         f"with python -m d2l_multi launch")
    return s


def _on_cloud_tpu_vm(dev="/dev"):
    """True on a Cloud TPU VM: the TPU runtime (the ``libtpu`` package) is installed and TPU
    chips are attached, which Linux shows as the device files ``/dev/accel*`` (TPU v4 and
    earlier) or ``/dev/vfio/<N>`` (later generations)."""
    if importlib.util.find_spec("libtpu") is None:
        return False
    return bool(glob.glob(os.path.join(dev, "accel*")) or
                glob.glob(os.path.join(dev, "vfio", "[0-9]*")))


def detect_cluster(environ=None):
    """The cluster manager that started this process as one of several ('slurm', 'ompi',
    'k8s' or 'tpu'), or None; read from the environment (and, for a Cloud TPU VM, /dev)."""
    env = os.environ if environ is None else environ
    slurm = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID",
             "SLURM_LOCALID")
    if all(v in env for v in slurm) and int(env["SLURM_NTASKS"]) > 1:
        return "slurm"
    if "OMPI_MCA_orte_hnp_uri" in env and int(env.get("OMPI_COMM_WORLD_SIZE", "1")) > 1:
        return "ompi"
    if "KUBERNETES_SERVICE_HOST" in env and "JOB_COMPLETION_INDEX" in env:
        return "k8s"
    if env.get("TPU_WORKER_HOSTNAMES") or env.get("TPU_PROCESS_ADDRESSES"):
        return "tpu"
    return "tpu" if environ is None and _on_cloud_tpu_vm() else None


def _check_devices_per_process(devices_per_process: int | None = None) -> None:
    check.integer(1, none=True, devices_per_process=devices_per_process)


def assert_device_counts(devices_per_process=None):
    """Raise unless every process has ``devices_per_process`` devices (default:
    as many as process 0)."""
    processes, counts = np.unique([d.process_index for d in jax.devices()],
                                  return_counts=True)
    expected = devices_per_process or int(counts[0])
    if (counts != expected).any():
        listing = ", ".join(f"process {p}: {n}" for p, n in zip(processes, counts))
        raise InputError(
            f"every process should have {expected} device(s), but {listing}. "
            f"JAX needs as many in every process: launch all of them with the "
            f"same --devices-per-process (and as many accelerators each)")


def _exit_at_once(kind, value, traceback):
    """``sys.excepthook`` of a process in a job: print the error, then end at once."""
    sys.__excepthook__(kind, value, traceback)
    exit_worker(130 if issubclass(kind, KeyboardInterrupt) else 1)


def _check_status(status: int = 0) -> None:
    if not isinstance(check._number(status), int) or not 0 <= status <= 255:
        raise InputError(f"status must be an exit status from 0 to 255, got {status!r}")


def exit_worker(status=0):
    """End this worker process with exit ``status``: success normally, a
    failure at once, waiting for nothing (neither the launcher nor the peers
    nor threads left waiting, as Orbax's are after a failed save)."""
    if status:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)  # no clean-up handlers, no shutdown barrier
    sys.exit(status)


def _check_timeout(name, value):
    try:
        check.integer(1, none=True, **{name: value})
    except InputError:
        raise InputError(f"{name} must be a whole number of seconds >= 1, or None, got "
                         f"{value!r}") from None


def _bound_cpu_waits(collective):
    """Make XLA's CPU collectives and topology exchange give up after ``collective`` seconds."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_collective_timeout" not in flags:  # read when JAX starts
        os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_collective_timeout_seconds={collective}"
    minutes = max(1, math.ceil(collective / 60))
    jax.config.update("jax_cpu_get_local_topology_timeout_minutes", minutes)
    jax.config.update("jax_cpu_get_global_topology_timeout_minutes", minutes + 1)


def _port_in_use(address):
    """The OSError for process 0 when something holds the coordinator's port."""
    host, port = address.rsplit(":", 1)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host.strip("[]"), int(port)))
        except PermissionError:
            return NoAccessError(f"process 0 could not start the coordinator on {address}: "
                                 f"ports below 1024 need root; launch again without --port")
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                return None  # leave it to JAX
            return PathError(f"process 0 could not start the coordinator on {address}: that port "
                             f"is in use. Launch again without --port to get a free one")
    return None


def _gpus_here(environ=None, driver="/proc/driver/nvidia/gpus"):
    """How many NVIDIA GPUs this process may use, or None without an NVIDIA driver."""
    env = os.environ if environ is None else environ
    if not os.path.isdir(driver):
        return None
    count = len(os.listdir(driver))
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        count = min(count, len([v for v in visible.split(",") if v.strip()]))
    return count


def _check_gpu_ids(process_id, devices_per_process, gpus):
    last = (process_id + 1) * devices_per_process
    if gpus and last > gpus:
        raise InputError(f"process {process_id} would use GPUs {last - devices_per_process}.."
                         f"{last - 1}, but this machine has {gpus} GPU(s): launch at most "
                         f"{gpus} devices in all (--processes x --devices-per-process), or set "
                         f"JAX_PLATFORMS=cpu to simulate CPU devices instead")


def _proof(secret, process_id):
    """What process ``process_id`` shows to prove it knows the launch's ``secret``."""
    return hmac.new(bytes.fromhex(secret), f"process {process_id}".encode(), "sha256").digest()


def _check_members(secret):
    """Raise PermissionError unless every process of the job knows this launch's secret.
    jax.distributed has no authentication: anyone who can reach the coordinator's port could
    join in a real worker's place. Each process shows a keyed hash of its id (not the secret),
    before any data moves."""
    from jax.experimental import multihost_utils
    mine = np.frombuffer(_proof(secret, jax.process_index()), np.uint8)
    shown = multihost_utils.process_allgather(mine)
    for i in range(jax.process_count()):
        if bytes(shown[i]) != _proof(secret, i):
            raise NoAccessError(
                f"process {i} did not show this launch's secret: a program that this launch "
                f"did not start joined the job as process {i} (another user's, or one started "
                f"by hand with copied D2L_MULTI_* settings). Stopping before any data moves")


def initialize_distributed(heartbeat_timeout: int | None = None,
                           collective_timeout: int | None = None) -> tuple[int, int]:
    """Join this process to its job; return ``(process_index, process_count)``.

    Under ``python -m d2l_multi launch``: simulate the launcher's number of CPU devices
    (accelerators stay visible), start or reach its coordinator on the launcher's loopback
    address only, and check that every process that joined knows the launch's secret (see
    docs/multi_process.md). On a SLURM, Open MPI,
    Kubernetes or Cloud TPU cluster: let ``jax.distributed.initialize()`` read the
    cluster's settings. Otherwise: a no-op, one process. Call it before any JAX computation.
    A peer silent for ``heartbeat_timeout`` seconds counts as dead; a CPU collective that
    waits ``collective_timeout`` seconds for its peers fails instead of hanging, and so does
    the exchange of device lists and the barrier at exit. After joining, an uncaught exception
    ends the process at once (see ``exit_worker``).
    """
    _check_timeout("heartbeat_timeout", heartbeat_timeout)
    _check_timeout("collective_timeout", collective_timeout)
    if jax.distributed.is_initialized():  # joined already (a second call)
        return jax.process_index(), jax.process_count()
    settings = launcher_settings() or {}
    if not settings and detect_cluster() is None:
        return 0, 1                       # alone: nothing to join
    heartbeat = heartbeat_timeout or settings.get("heartbeat_timeout") or 100  # JAX's default
    collective = collective_timeout or settings.get("collective_timeout")
    try:
        if collective:
            _bound_cpu_waits(collective)
        if settings:
            jax.config.update("jax_num_cpu_devices", settings["devices_per_process"])
            size_cpu_thread_pool(settings["devices_per_process"])  # see simulate_devices
            set_cpu_compiler_flags()
        if jax.config.jax_cpu_collectives_implementation is None:
            jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives
    except RuntimeError:
        raise RuntimeError("initialize_distributed() must run before any JAX computation "
                           "(even jax.devices()); call it first in the script") from None
    timeouts = dict(heartbeat_timeout_seconds=heartbeat,
                    shutdown_timeout_seconds=collective or 300)  # 300: JAX's default
    sys.excepthook = _exit_at_once        # from now on a failure must not wait for the peers
    if not settings:                      # a cluster: JAX reads its environment itself
        jax.distributed.initialize(**timeouts)
        assert_device_counts()
        return jax.process_index(), jax.process_count()
    D, pid, address = (settings["devices_per_process"], settings["process_id"],
                       settings["coordinator_address"])
    if os.environ.get("JAX_PLATFORMS", "").strip() != "cpu":
        _check_gpu_ids(pid, D, _gpus_here())
    if pid == 0 and (taken := _port_in_use(address)):
        raise taken
    jax.distributed.initialize(
        address, settings["num_processes"], pid,
        local_device_ids=list(range(pid * D, (pid + 1) * D)),  # GPUs q*D..q*D+D-1
        initialization_timeout=60, coordinator_bind_address=address,  # loopback only
        **timeouts)
    assert_device_counts(D)
    _check_members(settings["secret"])
    return jax.process_index(), jax.process_count()


def _check_process_batches(X: ArrayLike, y: ArrayLike, batch_size: int, shuffle: bool = False,
                           seed: int = 0, epoch: int = 0) -> None:
    """Raise a ValueError unless ``process_batches`` can take these arguments: a batch no
    larger than the data (an evaluation pads the last batch to its size)."""
    check.examples(X, y)
    check.labels(y)
    check.flag(shuffle=shuffle)
    check.positive(batch_size=batch_size)
    check.integer(0, seed=seed, epoch=epoch)
    if batch_size > len(X):
        raise InputError(f"batch_size={batch_size!r} is larger than the data ({len(X)} "
                         f"examples); pass at most {len(X)}")
    check.divisible(batch_size, jax.process_count(), over="processes")


def process_batches(X, y, batch_size, shuffle=False, seed=0, epoch=0):
    """Yield this process's rows ``(X, y, weight)`` of every global batch."""
    num_processes, q = jax.process_count(), jax.process_index()  # this is q
    if shuffle:  # the same order in every process: it depends on (seed, epoch)
        order = np.random.default_rng((seed, epoch)).permutation(len(X))
        order = order[:len(X) - len(X) % batch_size]  # drop a partial batch
    else:
        order = np.arange(len(X))
    pad = -len(order) % batch_size  # evaluation: pad it with rows of weight 0
    weight = np.pad(np.ones(len(order), np.float32), (0, pad))
    order = np.pad(order, (0, pad))
    local = batch_size // num_processes
    for start in range(0, len(order), batch_size):
        rows = slice(start + q * local, start + (q + 1) * local)
        yield X[order[rows]], y[order[rows]], weight[rows]


# The public names check their arguments first (check.validated); the chapter shows
# the functions themselves.
assert_device_counts = check.validated(assert_device_counts, _check_devices_per_process)
exit_worker = check.validated(exit_worker, _check_status)
process_batches = check.validated(process_batches, _check_process_batches)
