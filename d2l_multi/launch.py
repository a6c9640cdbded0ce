"""``python -m d2l_multi launch``: run one command as K cooperating processes on this machine.

Like ``torchrun`` for PyTorch: it picks a free loopback port for JAX's coordinator, starts K
workers with ``D2L_MULTI_COORDINATOR_ADDRESS``, ``D2L_MULTI_NUM_PROCESSES``,
``D2L_MULTI_PROCESS_ID`` and ``D2L_MULTI_DEVICES_PER_PROCESS`` in their environment (read by
``d2l_multi.initialize_distributed()``), prefixes their output with ``[p0]``, ``[p1]``, ... and,
as soon as one worker fails, stops the others and exits non-zero naming the one that died.
Every wait is bounded: ``--timeout`` bounds the whole job, processes a worker leaves behind are
killed, and a watchdog process kills the workers if the launcher itself dies.

    python -m d2l_multi launch --processes 2 --devices-per-process 4 -- \\
        python -m d2l_multi.mp_train --epochs 2
"""
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from .cli import OneLineParser
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


MAX_PROCESSES = 64  # workers share one machine's cores; more would only thrash it
TIMEOUT_STATUS = 124  # the exit status of a job stopped by --timeout (as timeout(1) uses)


class LaunchError(ValueError):
    """A launcher argument is wrong; the message says which and how to fix it."""


def parser():
    p = OneLineParser(
        prog="python -m d2l_multi launch",
        usage="%(prog)s [options] -- COMMAND [ARGS ...]",
        description="Start COMMAND as several JAX processes on this machine (127.0.0.1), "
                    "each with its own devices, joined by jax.distributed. The command calls "
                    "d2l_multi.initialize_distributed() first.")
    p.add_argument("--processes", "-n", type=int, default=2, metavar="K",
                   help=f"number of worker processes, 1..{MAX_PROCESSES} (default 2)")
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
                   help="seconds the other workers get to stop after SIGTERM before SIGKILL, "
                        "and processes a finished worker left behind before they are killed "
                        "(default 2)")
    p.add_argument("--timeout", type=float, default=None, metavar="SEC",
                   help=f"stop all workers and exit with {TIMEOUT_STATUS} if the job is not "
                        f"done after SEC seconds, naming the workers still running "
                        f"(default: no limit)")
    p.add_argument("--verbose", action="store_true",
                   help="keep gloo's connection chatter ('[Gloo] Rank i is connected ...')")
    return p


_VALUED = {"--processes", "-n", "--devices-per-process", "--port", "--heartbeat-timeout",
           "--collective-timeout", "--grace-period", "--timeout"}  # options with a value


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
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
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


def _whole(name, value, low, high=None):
    if isinstance(value, bool) or not isinstance(value, int) or value < low or \
            (high is not None and value > high):
        bound = f"from {low} to {high}" if high is not None else f"at least {low}"
        raise LaunchError(f"{name} must be a whole number {bound}, got {value}")


def _seconds(name, value, positive=True, allow_none=False):
    if value is None and allow_none:
        return
    ok = (not isinstance(value, bool) and isinstance(value, (int, float))
          and math.isfinite(value) and (value > 0 if positive else value >= 0))
    if not ok:
        need = "> 0" if positive else ">= 0"
        raise LaunchError(f"{name} must be a finite number of seconds {need}, got {value}")


def check_settings(processes, devices_per_process, port=None, heartbeat_timeout=10,
                   collective_timeout=120, grace_period=2.0, timeout=None):
    """Raise LaunchError naming the first wrong setting and the fix."""
    _whole("--processes", processes, 1, MAX_PROCESSES)
    _whole("--devices-per-process", devices_per_process, 1)
    _whole("--heartbeat-timeout", heartbeat_timeout, 1)
    _whole("--collective-timeout", collective_timeout, 1)
    _seconds("--grace-period", grace_period, positive=False)
    _seconds("--timeout", timeout, allow_none=True)
    if port is not None:
        check_port(port)


def check_args(args, command):
    """Raise LaunchError naming the wrong value and the fix."""
    check_settings(args.processes, args.devices_per_process, None, args.heartbeat_timeout,
                   args.collective_timeout, args.grace_period, args.timeout)
    if not command:
        raise LaunchError("no command to run; put it after '--', e.g. "
                          "python -m d2l_multi launch -n 2 -- python -m d2l_multi.mp_train")


def command_problem(command):
    """Why ``command`` cannot be started (it is not found), or None."""
    program = command[0]
    if program.endswith(".py"):
        return None if os.path.isfile(program) else (
            f"no Python script {program!r}; check the command after '--'")
    if shutil.which(program) is None:
        return f"cannot find the program {program!r}; check the command after '--'"
    return None


def job_env(process_id, num_processes, devices_per_process, port, heartbeat_timeout=10,
            collective_timeout=120):
    """The variables the launcher sets for worker ``process_id`` of the job."""
    _whole("num_processes", num_processes, 1, MAX_PROCESSES)
    _whole("process_id", process_id, 0, num_processes - 1)
    _whole("devices_per_process", devices_per_process, 1)
    _whole("port", port, 1, 65535)
    _whole("heartbeat_timeout", heartbeat_timeout, 1)
    _whole("collective_timeout", collective_timeout, 1)
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


def start_worker(command, env):
    """Start one worker in its own session and process group, its stderr merged into its
    stdout (no code runs in the child before ``exec``, so this is safe with threads)."""
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, start_new_session=True)


# The watchdog: a few lines of Python that outlive the launcher. It reads the workers' process
# groups from a pipe that only the launcher holds. "done" means the launcher ended normally;
# end of file without it means the launcher died (even by SIGKILL), and the groups are killed.
WATCHDOG = """
import os, signal, sys
groups = set()
for line in sys.stdin:
    if line.strip() == "done":
        sys.exit(0)
    groups.add(int(line))
for group in groups:
    try:
        os.killpg(group, signal.SIGKILL)
    except OSError:
        pass
"""


class Watchdog:
    """Kills every worker's process group if the launcher dies before it calls ``release``."""

    def __init__(self):
        read, self._write = os.pipe()  # neither end is inherited by the workers
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-I", "-S", "-c", WATCHDOG], stdin=read,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True)  # no terminal signal (Ctrl-C) reaches it
        finally:
            os.close(read)

    def watch(self, group):
        """Kill process group ``group`` if the launcher dies."""
        try:
            os.write(self._write, f"{group}\n".encode())
        except OSError as e:  # the watchdog is gone: the job runs on, unguarded
            _log(f"the watchdog has ended ({e.strerror}); workers may outlive a killed "
                 f"launcher")

    def release(self):
        """The workers have ended: let the watchdog exit without killing anything."""
        try:
            os.write(self._write, b"done\n")
        except OSError:
            pass
        os.close(self._write)
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def stream(proc, prefix, lock, verbose=False, out=None, on_line=None):
    """Copy ``proc``'s output line by line to ``out`` (stdout), each line after ``prefix``;
    call ``on_line(line)`` for every line shown."""
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
        if on_line is not None:
            on_line(line)
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


def _group_alive(proc):
    """True while any process is left in the process group that ``proc`` led."""
    try:
        os.killpg(proc.pid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


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
    for i, p in enumerate(procs):
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _log(f"p{i} (pid {p.pid}) did not end 10 s after SIGKILL; giving up on it")


def _log(message):
    sys.stderr.write(f"[launch] {message}\n")  # one write: lines of workers cannot cut it
    sys.stderr.flush()


class _Terminated(Exception):
    pass


def _raise_terminated(signum, frame):
    raise _Terminated(signal.Signals(signum).name)


class _Worker:
    """A started worker: its process, its output thread and its last line of output."""

    def __init__(self, index, proc, lock, verbose):
        self.index, self.proc, self.last, self.last_time = index, proc, None, None
        self.thread = threading.Thread(target=stream, daemon=True, args=(
            proc, f"[p{index}]", lock, verbose, None, self._saw))
        self.thread.start()

    def _saw(self, line):
        self.last, self.last_time = line, time.monotonic()

    def __str__(self):
        return f"p{self.index} (pid {self.proc.pid})"

    def describe_output(self, now):
        if self.last is None:
            return "printed nothing yet"
        return f"last printed {now - self.last_time:.0f} s ago: {self.last[:160]!r}"


def _join_output(workers, seconds):
    deadline = time.monotonic() + seconds
    for w in workers:
        w.thread.join(timeout=max(0.0, deadline - time.monotonic()))


def _clean_up_after_success(workers, grace_period):
    """After every worker exited 0: give what they left behind ``grace_period`` to end, then
    kill it (it could hold a worker's output open forever) and say so."""
    deadline = time.monotonic() + grace_period
    while time.monotonic() < deadline and any(
            w.thread.is_alive() or _group_alive(w.proc) for w in workers):
        time.sleep(0.05)
    for w in workers:
        if _group_alive(w.proc):
            _log(f"{w} exited but left processes running in its process group; killing them")
            _signal_group(w.proc, signal.SIGKILL)
    _join_output(workers, 5)
    for w in workers:
        if w.thread.is_alive():
            _log(f"the output of {w} is still held open by a process outside its process "
                 f"group; not waiting for it")


def _report_timeout(workers, timeout):
    now = time.monotonic()
    running = [w for w in workers if w.proc.poll() is None]
    _log(f"timed out: the job did not finish within --timeout {timeout:g} s; still running: "
         f"{', '.join(str(w) for w in running) or 'none'}")
    for w in workers:
        state = "still running" if w in running else describe_exit(w.proc.returncode)
        _log(f"  {w} {state}, {w.describe_output(now)}")
    if running:
        silent = min(running, key=lambda w: (w.last_time is not None, w.last_time or 0))
        _log(f"  the job waits on {silent}: it has been silent longest "
             f"({silent.describe_output(now)})")


def _supervise(command, processes, env_of, grace_period, timeout, verbose, watchdog):
    """Start the workers and wait for the job; return the exit status. Stops every worker
    before it returns or raises."""
    lock, workers, start = threading.Lock(), [], time.monotonic()
    try:
        for i in range(processes):
            try:
                proc = start_worker(command, env_of(i))
            except OSError as e:
                _log(f"cannot start {command[0]!r}: {e.strerror}; check the command after '--'")
                stop_workers([w.proc for w in workers], 0)
                return 127
            watchdog.watch(proc.pid)
            workers.append(_Worker(i, proc, lock, verbose))
        _log("started " + ", ".join(f"p{w.index} (pid {w.proc.pid})" for w in workers))
        while True:
            codes = [w.proc.poll() for w in workers]
            failed = [w for w, c in zip(workers, codes) if c not in (None, 0)]
            if failed or all(c == 0 for c in codes):
                break
            if timeout is not None and time.monotonic() - start > timeout:
                _report_timeout(workers, timeout)
                stop_workers([w.proc for w in workers], grace_period)
                _join_output(workers, 5)
                _log(f"FAILED: stopped by --timeout {timeout:g} s")
                return TIMEOUT_STATUS
            time.sleep(0.05)
    except BaseException:
        stop_workers([w.proc for w in workers], grace_period)
        raise
    elapsed = time.monotonic() - start
    if not failed:
        _clean_up_after_success(workers, grace_period)
        _log(f"all {processes} worker(s) finished OK in {elapsed:.1f} s")
        return 0
    first = failed[0]
    code = first.proc.returncode
    _log(f"worker {first} failed after {elapsed:.1f} s: {describe_exit(code)}; stopping the "
         f"others")
    running = [w for w in workers if w.proc.poll() is None]
    stop_workers([w.proc for w in workers], grace_period)
    _join_output(workers, 5)
    for w in workers:
        if w is not first:
            how = "stopped by the launcher" if w in running else "ended on its own"
            _log(f"  {w} {how}: {describe_exit(w.proc.returncode)}")
    _log(f"FAILED: worker p{first.index} died first ({describe_exit(code)})")
    return code if code > 0 else 128 - code


def run(command, processes, devices_per_process, port=None, heartbeat_timeout=10,
        collective_timeout=120, grace_period=2.0, verbose=False, timeout=None):
    """Run ``command`` as ``processes`` workers; return 0, the failing worker's code, 124
    after ``timeout`` seconds, or 130 when interrupted."""
    check_settings(processes, devices_per_process, port, heartbeat_timeout, collective_timeout,
                   grace_period, timeout)
    if not command:
        raise LaunchError("no command to run: pass it as a list, e.g. ['python', 'train.py']")
    command = list(command)
    port = port or free_port()
    if command[0].endswith(".py"):
        command = [sys.executable, *command]
    _log(f"{processes} process(es) x {devices_per_process} device(s), coordinator "
         f"{HOST}:{port}: {' '.join(command)}")
    def env_of(i):
        return worker_env(i, processes, devices_per_process, port, heartbeat_timeout,
                          collective_timeout)
    in_main = threading.current_thread() is threading.main_thread()
    stop_on = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    old = {s: signal.signal(s, _raise_terminated) for s in stop_on} if in_main else {}
    watchdog = Watchdog()
    try:
        return _supervise(command, processes, env_of, grace_period, timeout, verbose, watchdog)
    except (KeyboardInterrupt, _Terminated) as e:
        _log(f"interrupted ({e or 'SIGINT'}); stopped all workers")
        return 130
    finally:
        watchdog.release()
        for s, handler in old.items():
            signal.signal(s, handler)


def main(argv=None):
    """Entry point of ``python -m d2l_multi launch``; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    options, command = split_command(argv)
    try:
        args = parser().parse_args(options)
    except SystemExit as e:  # the parser has printed the error (or --help)
        return e.code
    try:
        check_args(args, command)
        if args.port is not None:
            check_port(args.port)
    except LaunchError as e:
        print(f"python -m d2l_multi launch: error: {e}", file=sys.stderr)
        return 2
    problem = command_problem(command)
    if problem:
        print(f"python -m d2l_multi launch: error: {problem}", file=sys.stderr)
        return 127
    return run(command, args.processes, args.devices_per_process, args.port,
               args.heartbeat_timeout, args.collective_timeout, args.grace_period,
               args.verbose, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
