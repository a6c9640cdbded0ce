"""``python -m d2l_multi launch``: run one command as K cooperating processes on this machine.

Like ``torchrun`` for PyTorch: it picks a free loopback port for JAX's coordinator, starts K
workers with ``D2L_MULTI_COORDINATOR_ADDRESS``, ``D2L_MULTI_NUM_PROCESSES``,
``D2L_MULTI_PROCESS_ID`` and ``D2L_MULTI_DEVICES_PER_PROCESS`` in their environment (read by
``d2l_multi.initialize_distributed()``), prefixes their output with ``[p0]``, ``[p1]``, ... and,
as soon as one worker fails, stops the others and exits non-zero naming the one that died.

    python -m d2l_multi launch --processes 2 --devices-per-process 4 -- \\
        python -m d2l_multi.mp_train --epochs 2
"""
import argparse
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

from .distributed import (COLLECTIVE_TIMEOUT_ENV, COORDINATOR_ENV, DEVICES_PER_PROCESS_ENV,
                          HEARTBEAT_TIMEOUT_ENV, NUM_PROCESSES_ENV, PROCESS_ID_ENV)

HOST = "127.0.0.1"        # workers talk over loopback only; a multi-host job uses its cluster
# gloo prints "[Gloo] Rank i is connected to N peer ranks. Expected number of connected peer
# ranks is : N" once per device, piece by piece and from several threads at once, so the
# pieces of different messages interleave and land on neighbouring lines. They are cut out.
GLOO_PIECES = re.compile(r"\[Gloo\] Rank (\d+)?|(\d+)? ?is connected to (\d+)?|"
                         r"(\d+)? ?peer ranks\. |Expected number of connected peer ranks is : "
                         r"(\d+)?")


def drop_gloo_chatter(line):
    """``line`` without gloo's connection messages or pieces of them ('' if nothing is left)."""
    if not any(p in line for p in ("[Gloo] Rank", "is connected to", "peer ranks")):
        return line
    rest = GLOO_PIECES.sub("", line)
    return "" if re.fullmatch(r"[\d\s]*", rest) else rest


class LaunchError(Exception):
    """A launcher argument is wrong; the message says which and how to fix it."""


def parser():
    p = argparse.ArgumentParser(
        prog="python -m d2l_multi launch",
        usage="%(prog)s [options] -- COMMAND [ARGS ...]",
        description="Start COMMAND as several JAX processes on this machine (127.0.0.1), "
                    "each with its own devices, joined by jax.distributed. The command calls "
                    "d2l_multi.initialize_distributed() first.")
    p.add_argument("--processes", "-n", type=int, default=2, metavar="K",
                   help="number of worker processes (default 2)")
    p.add_argument("--devices-per-process", type=int, default=1, metavar="D",
                   help="devices of each process: simulated CPU devices, or that many "
                        "accelerators each where there are some (default 1)")
    p.add_argument("--port", type=int, default=None, metavar="PORT",
                   help="coordinator port on 127.0.0.1 (default: a free one)")
    p.add_argument("--heartbeat-timeout", type=int, default=10, metavar="SEC",
                   help="seconds without a heartbeat after which JAX declares a worker dead "
                        "and stops the others (default 10; JAX's own default is 100)")
    p.add_argument("--collective-timeout", type=int, default=120, metavar="SEC",
                   help="seconds a CPU collective waits for its peers before it fails "
                        "instead of hanging (default 120)")
    p.add_argument("--grace-period", type=float, default=2.0, metavar="SEC",
                   help="seconds the other workers get to stop after SIGTERM before SIGKILL "
                        "(default 2)")
    p.add_argument("--verbose", action="store_true",
                   help="keep gloo's connection chatter ('[Gloo] Rank i is connected ...')")
    return p


_VALUED = {"--processes", "-n", "--devices-per-process", "--port", "--heartbeat-timeout",
           "--collective-timeout", "--grace-period"}  # options followed by a value


def split_command(argv):
    """Split ``[options] -- COMMAND ...`` into the launcher's options and the command."""
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    for i, arg in enumerate(argv):  # no "--": the command starts at the first non-option
        if not arg.startswith("-") and (i == 0 or argv[i - 1] not in _VALUED):
            return argv[:i], argv[i:]
    return argv, []


def free_port(host=HOST):
    """A TCP port on ``host`` that nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def check_port(port, host=HOST):
    """Raise LaunchError when ``port`` is out of range or something listens on it."""
    if not 1 <= port <= 65535:
        raise LaunchError(f"--port {port} is not a TCP port; use 1..65535, or leave --port "
                          f"out to get a free one")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # ignore TIME_WAIT leftovers
        try:
            s.bind((host, port))
        except OSError as e:
            raise LaunchError(f"port {port} on {host} is already in use ({e.strerror}): "
                              f"another job or a previous run still holds it. Pick another "
                              f"--port, or leave --port out to get a free one") from None


def check_args(args, command):
    """Raise LaunchError naming the wrong value and the fix."""
    if args.processes < 1:
        raise LaunchError(f"--processes must be at least 1, got {args.processes}")
    if args.devices_per_process < 1:
        raise LaunchError(f"--devices-per-process must be at least 1, got "
                          f"{args.devices_per_process}")
    if args.heartbeat_timeout < 1:
        raise LaunchError(f"--heartbeat-timeout must be at least 1 second, got "
                          f"{args.heartbeat_timeout}")
    if args.collective_timeout < 1:
        raise LaunchError(f"--collective-timeout must be at least 1 second, got "
                          f"{args.collective_timeout}")
    if args.grace_period < 0:
        raise LaunchError(f"--grace-period must be >= 0 seconds, got {args.grace_period}")
    if not command:
        raise LaunchError("no command to run; put it after '--', e.g. "
                          "python -m d2l_multi launch -n 2 -- python -m d2l_multi.mp_train")


def job_env(process_id, num_processes, devices_per_process, port, heartbeat_timeout=10,
            collective_timeout=120):
    """The variables the launcher sets for worker ``process_id`` of the job."""
    return {COORDINATOR_ENV: f"{HOST}:{port}",
            NUM_PROCESSES_ENV: str(num_processes),
            PROCESS_ID_ENV: str(process_id),
            DEVICES_PER_PROCESS_ENV: str(devices_per_process),
            HEARTBEAT_TIMEOUT_ENV: str(heartbeat_timeout),
            COLLECTIVE_TIMEOUT_ENV: str(collective_timeout),
            "JAX_NUM_CPU_DEVICES": str(devices_per_process),
            "PYTHONUNBUFFERED": "1"}  # so lines arrive as they are printed


def worker_env(*args, **kwargs):
    """The environment of a worker: the launcher's own plus ``job_env(*args, **kwargs)``."""
    return {**os.environ, **job_env(*args, **kwargs)}


def _parent_death_signal():
    """A function that, called in a child, makes Linux SIGKILL it when its parent dies."""
    try:
        import ctypes
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up here, in the parent
    except (OSError, AttributeError):
        return None
    return lambda: prctl(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def start_worker(command, env):
    """Start one worker in its own process group, its stderr merged into its stdout.

    On Linux the worker also gets SIGKILL if the launcher dies, so none outlives it.
    """
    die_with_parent = _parent_death_signal() if sys.platform == "linux" else None
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=die_with_parent)


def stream(proc, prefix, lock, verbose=False, out=None):
    """Copy ``proc``'s output line by line to ``out`` (stdout), each line after ``prefix``."""
    out = out or sys.stdout
    for raw in iter(proc.stdout.readline, b""):
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        if not verbose:
            line = drop_gloo_chatter(line)
            if not line.strip():
                continue
        with lock:
            out.write(f"{prefix} {line}\n")
            out.flush()
    proc.stdout.close()


def describe_exit(code):
    """'exit code 1' or 'killed by SIGKILL' for a Popen return code."""
    if code is None:
        return "still running"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"


def _signal_group(proc, sig):
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def stop_workers(procs, grace_period):
    """SIGTERM every worker's process group, wait ``grace_period``, then SIGKILL the rest.

    JAX workers catch SIGTERM as a preemption notice and keep running, so the SIGKILL that
    follows is what usually ends them; the grace period lets other programs clean up.
    """
    for p in procs:
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace_period
    while time.monotonic() < deadline and any(p.poll() is None for p in procs):
        time.sleep(0.05)
    for p in procs:
        _signal_group(p, signal.SIGKILL)  # also any children the worker left behind
    for p in procs:
        p.wait()


def _log(message):
    print(f"[launch] {message}", file=sys.stderr, flush=True)


class _Terminated(Exception):
    pass


def _raise_terminated(signum, frame):
    raise _Terminated(signal.Signals(signum).name)


def run(command, processes, devices_per_process, port=None, heartbeat_timeout=10,
        collective_timeout=120, grace_period=2.0, verbose=False):
    """Run ``command`` as ``processes`` workers; return 0, or the failing worker's code."""
    port = port or free_port()
    if command[0].endswith(".py"):
        command = [sys.executable, *command]
    _log(f"{processes} process(es) x {devices_per_process} device(s), coordinator "
         f"{HOST}:{port}: {' '.join(command)}")
    lock, procs, threads = threading.Lock(), [], []
    start = time.monotonic()
    in_main = threading.current_thread() is threading.main_thread()
    stop_on = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.signal(s, _raise_terminated) for s in stop_on} if in_main else {}
    try:
        for i in range(processes):  # all of them before any thread: fork is not thread-safe
            env = worker_env(i, processes, devices_per_process, port, heartbeat_timeout,
                             collective_timeout)
            try:
                procs.append(start_worker(command, env))
            except OSError as e:
                _log(f"cannot start {command[0]!r}: {e.strerror}; check the command after '--'")
                stop_workers(procs, 0)
                return 127
        for i, p in enumerate(procs):
            threads.append(threading.Thread(target=stream, args=(p, f"[p{i}]", lock, verbose),
                                            daemon=True))
            threads[-1].start()
        _log("started " + ", ".join(f"p{i} (pid {p.pid})" for i, p in enumerate(procs)))
        while True:
            codes = [p.poll() for p in procs]
            failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
            if failed or all(c == 0 for c in codes):
                break
            time.sleep(0.05)
    except (KeyboardInterrupt, _Terminated) as e:
        _log(f"interrupted ({e or 'SIGINT'}); stopping all workers")
        stop_workers(procs, grace_period)
        return 130
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)
    elapsed = time.monotonic() - start
    if not failed:
        for t in threads:
            t.join()
        _log(f"all {processes} worker(s) finished OK in {elapsed:.1f} s")
        return 0
    first = failed[0]
    code = procs[first].returncode
    _log(f"worker p{first} (pid {procs[first].pid}) failed after {elapsed:.1f} s: "
         f"{describe_exit(code)}; stopping the others")
    running = [i for i, p in enumerate(procs) if p.poll() is None]
    stop_workers(procs, grace_period)
    for t in threads:
        t.join(timeout=5)
    for i, p in enumerate(procs):
        if i != first:
            how = "stopped by the launcher" if i in running else "ended on its own"
            _log(f"  p{i} (pid {p.pid}) {how}: {describe_exit(p.returncode)}")
    _log(f"FAILED: worker p{first} died first ({describe_exit(code)})")
    return code if code > 0 else 128 - code


def main(argv=None):
    """Entry point of ``python -m d2l_multi launch``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    options, command = split_command(argv)
    try:
        args = parser().parse_args(options)
    except SystemExit as e:  # argparse has printed the usage and the error
        return e.code
    try:
        check_args(args, command)
        if args.port is not None:
            check_port(args.port)
    except LaunchError as e:
        print(f"python -m d2l_multi launch: error: {e}", file=sys.stderr)
        return 2
    return run(command, args.processes, args.devices_per_process, args.port,
               args.heartbeat_timeout, args.collective_timeout, args.grace_period,
               args.verbose)


if __name__ == "__main__":
    sys.exit(main())
