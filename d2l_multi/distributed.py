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
import importlib.util
import math
import os
import socket
import sys

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import d2l_multi as d2l

# What the launcher (d2l_multi/launch.py) puts into every worker's environment.
COORDINATOR_ENV = "D2L_MULTI_COORDINATOR_ADDRESS"
NUM_PROCESSES_ENV = "D2L_MULTI_NUM_PROCESSES"
PROCESS_ID_ENV = "D2L_MULTI_PROCESS_ID"
DEVICES_PER_PROCESS_ENV = "D2L_MULTI_DEVICES_PER_PROCESS"
HEARTBEAT_TIMEOUT_ENV = "D2L_MULTI_HEARTBEAT_TIMEOUT"
COLLECTIVE_TIMEOUT_ENV = "D2L_MULTI_COLLECTIVE_TIMEOUT"


def _env_int(name, minimum, env):
    """The integer in environment variable ``name`` (of mapping ``env``), at least ``minimum``."""
    text = env.get(name)
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise ValueError(f"{name}={text!r} is not an integer; the launcher sets it "
                         f"(python -m d2l_multi launch ...), so do not edit it by hand") from None
    if value < minimum:
        raise ValueError(f"{name}={value} must be at least {minimum}")
    return value


def launcher_settings(environ=None):
    """The settings ``python -m d2l_multi launch`` gave this process; None outside it."""
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
         if env.get(COLLECTIVE_TIMEOUT_ENV) else None}
    if s["process_id"] >= s["num_processes"]:
        raise ValueError(f"{PROCESS_ID_ENV}={s['process_id']} but the job has only "
                         f"{s['num_processes']} processes (ids 0..{s['num_processes'] - 1})")
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
    """Name the cluster manager that started this process as one of several, or None.

    Returns 'slurm' (inside ``srun`` with more than one task), 'ompi' (``mpirun`` with more
    than one rank), 'k8s' (a pod of an indexed Kubernetes Job) or 'tpu' (a Cloud TPU VM, or a
    TPU pod on Kubernetes). It reads only environment variables (of ``environ``, default
    ``os.environ``) and, for Cloud TPU VMs, which device files exist.
    """
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


def check_devices_per_process(devices_per_process):
    """Raise a ValueError unless ``devices_per_process`` is a positive integer or None."""
    if devices_per_process is not None and (type(devices_per_process) is not int
                                            or devices_per_process < 1):
        raise ValueError(f"devices_per_process must be a positive integer or None, got "
                         f"{devices_per_process!r}")


def check_device_counts(devices_per_process=None):
    """Raise unless every process has ``devices_per_process`` devices (default: as process 0)."""
    d2l.check_devices_per_process(devices_per_process)
    processes, counts = np.unique([d.process_index for d in jax.devices()], return_counts=True)
    expected = devices_per_process or int(counts[0])
    if (counts != expected).any():
        listing = ", ".join(f"process {p}: {n}" for p, n in zip(processes, counts))
        raise ValueError(f"every process should have {expected} device(s), but {listing}. JAX "
                         f"needs as many in every process: launch all of them with the same "
                         f"--devices-per-process (and as many accelerators each)")


def _exit_at_once(kind, value, traceback):
    """``sys.excepthook`` of a process in a job: print the error as usual, then end the process
    at once instead of waiting in JAX's shutdown barrier for peers that may never arrive."""
    sys.__excepthook__(kind, value, traceback)
    exit_worker(130 if issubclass(kind, KeyboardInterrupt) else 1)


def exit_worker(status=0):
    """End this worker process with exit ``status`` (0..255). A failure in a process that has
    joined (or tried to join) a job ends it at once (``os._exit``, after flushing its output),
    so that neither the launcher nor its peers wait for it; success, or a process alone, exits
    normally."""
    if isinstance(status, bool) or not isinstance(status, int) or not 0 <= status <= 255:
        raise ValueError(f"status must be an exit status from 0 to 255, got {status!r}")
    if status and (sys.excepthook is _exit_at_once or jax.distributed.is_initialized()):
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)
    sys.exit(status)


def _check_timeout(name, value):
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                              or value < 1):
        raise ValueError(f"{name} must be a whole number of seconds >= 1, or None, got "
                         f"{value!r}")


def _bound_cpu_waits(collective):
    """Make XLA's CPU collectives and topology exchange give up after ``collective`` seconds
    (the topology exchange counts whole minutes) instead of their defaults (2 and 5 min)."""
    flags = os.environ.get("XLA_FLAGS", "")
    if "xla_cpu_collective_timeout" not in flags:  # read when JAX starts
        os.environ["XLA_FLAGS"] = f"{flags} --xla_cpu_collective_timeout_seconds={collective}"
    minutes = max(1, math.ceil(collective / 60))
    jax.config.update("jax_cpu_get_local_topology_timeout_minutes", minutes)
    jax.config.update("jax_cpu_get_global_topology_timeout_minutes", minutes + 1)


def _port_in_use(address):
    """The OSError for process 0 when something holds the coordinator's port. JAX's service
    binds it on every interface; its own failure to do so can crash the process."""
    message = (f"process 0 could not start the coordinator on {address}: that port is in "
               f"use. Launch again without --port to get a free one")
    port = int(address.rsplit(":", 1)[1])
    for family, host in ((socket.AF_INET6, "::"), (socket.AF_INET, "0.0.0.0")):
        try:
            with socket.socket(family, socket.SOCK_STREAM) as s:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                s.bind((host, port))
                return None
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                return OSError(message)
    return None  # neither family could be tried: leave it to JAX


def initialize_distributed(heartbeat_timeout=None, collective_timeout=None):
    """Join this process to its job; return ``(process_index, process_count)``.

    Under ``python -m d2l_multi launch``: simulate the launcher's number of CPU devices
    (accelerators stay visible) and connect to its coordinator. On a SLURM, Open MPI,
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
    settings = d2l.launcher_settings() or {}
    if not settings and d2l.detect_cluster() is None:
        return 0, 1                       # alone: nothing to join
    heartbeat = heartbeat_timeout or settings.get("heartbeat_timeout") or 100  # JAX's default
    collective = collective_timeout or settings.get("collective_timeout")
    try:
        if collective:
            _bound_cpu_waits(collective)
        if settings:
            jax.config.update("jax_num_cpu_devices", settings["devices_per_process"])
            d2l.size_cpu_thread_pool(settings["devices_per_process"])  # see simulate_devices
            d2l.set_cpu_compiler_flags()
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
        d2l.check_device_counts()
        return jax.process_index(), jax.process_count()
    k, pid = settings["devices_per_process"], settings["process_id"]
    if pid == 0 and (taken := _port_in_use(settings["coordinator_address"])):
        raise taken
    try:
        jax.distributed.initialize(
            settings["coordinator_address"], settings["num_processes"], pid,
            local_device_ids=list(range(pid * k, (pid + 1) * k)),  # GPUs p*k..p*k+k-1
            initialization_timeout=60, **timeouts)
    except jax.errors.JaxRuntimeError as e:
        if "Failed to start RPC server" not in str(e):
            raise
        raise OSError(f"process 0 could not start the coordinator on "
                      f"{settings['coordinator_address']}: that port is in use. Launch "
                      f"again without --port to get a free one") from None
    d2l.check_device_counts(k)
    return jax.process_index(), jax.process_count()


def check_batch_inputs(X, y, batch_size, seed, epoch):
    """Raise a ValueError unless ``process_batches`` can take these arguments."""
    d2l.check_labels(X, y)
    d2l.check_positive(batch_size=batch_size)
    for name, value in [("seed", seed), ("epoch", epoch)]:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative integer, got {value!r}")


def process_batches(X, y, batch_size, shuffle=False, seed=0, epoch=0):
    """Yield this process's rows ``(X, y, weight)`` of every global batch of ``batch_size``."""
    d2l.check_batch_inputs(X, y, batch_size, seed, epoch)
    n, num_processes, p = len(X), jax.process_count(), jax.process_index()
    d2l.check_divisible(batch_size, num_processes, over="processes")
    order = np.random.default_rng((seed, epoch)).permutation(n) if shuffle else np.arange(n)
    if shuffle:  # training: drop the last incomplete batch
        order = order[:n - n % batch_size]
    pad = -len(order) % batch_size  # evaluation: pad it with rows of weight 0
    weight = np.pad(np.ones(len(order), np.float32), (0, pad))
    order = np.pad(order, (0, pad))
    local = batch_size // num_processes
    for start in range(0, len(order), batch_size):
        rows = slice(start + p * local, start + (p + 1) * local)
        yield X[order[rows]], y[order[rows]], weight[rows]


def check_mesh_and_arrays(mesh, local_arrays):
    """Raise a ValueError unless ``mesh`` is a Mesh and ``local_arrays`` holds some arrays."""
    if not isinstance(mesh, jax.sharding.Mesh):
        raise ValueError(f"mesh must be a jax.sharding.Mesh, e.g. d2l.device_mesh(), got "
                         f"{type(mesh).__name__}")
    if not local_arrays:
        raise ValueError("pass the arrays to assemble, e.g. global_batch(mesh, X, y)")


def global_batch(mesh, *local_arrays):
    """Assemble each process's rows into global arrays sharded over ``mesh``'s first axis."""
    d2l.check_mesh_and_arrays(mesh, local_arrays)
    sharding = NamedSharding(mesh, P(mesh.axis_names[0]))
    return tuple(jax.make_array_from_process_local_data(sharding, a) for a in local_arrays)
