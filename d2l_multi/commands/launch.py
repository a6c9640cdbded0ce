"""``python -m d2l_multi launch``: run one command as K cooperating processes on this machine.

Like ``torchrun`` for PyTorch: it picks a free loopback port for JAX's coordinator, starts K
workers with ``D2L_MULTI_COORDINATOR_ADDRESS``, ``D2L_MULTI_NUM_PROCESSES``,
``D2L_MULTI_PROCESS_ID`` and ``D2L_MULTI_DEVICES_PER_PROCESS`` in their environment (read by
``d2l_multi.initialize_distributed()``), prefixes their output with ``[p0]``, ``[p1]``, ... and,
as soon as one worker fails, stops the others and exits non-zero naming the one that died.
Every wait is bounded: ``--timeout`` bounds the whole job, processes a worker leaves behind are
killed, and a watchdog process kills the workers if the launcher itself dies. SIGINT, SIGTERM
and SIGHUP stop the workers (a second one skips the grace period). The coordinator listens on
127.0.0.1 only, and every worker proves that it was started by this launch (a per-launch
secret) before any data moves: see docs/multi_process.md for what a shared machine exposes.

    python -m d2l_multi launch --processes 2 --devices-per-process 4 -- \\
        python -m d2l_multi.mp_train --epochs 2
"""
import argparse
import collections
import hmac
import math
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time

from ..distributed import (
    COLLECTIVE_TIMEOUT_ENV,
    COORDINATOR_ENV,
    DEVICES_PER_PROCESS_ENV,
    HEARTBEAT_TIMEOUT_ENV,
    LAUNCHER_PID_ENV,
    NUM_PROCESSES_ENV,
    PROCESS_ID_ENV,
    SECRET_ENV,
)
from ..errors import InputError

HOST = "127.0.0.1"        # workers talk over loopback only; a multi-host job uses its cluster
# gloo prints "[Gloo] Rank i is connected to N peer ranks. Expected number of connected peer
# ranks is : N" once per device, piece by piece and from several threads at once, so the
# pieces of different messages interleave and land on neighbouring lines. They are cut out.
GLOO_PIECES = re.compile(r"\[Gloo\] Rank (\d+)?|(\d+)? ?is connected to (\d+)?|"
                         r"(\d+)? ?peer ranks\. |Expected number of connected peer ranks is : "
                         r"(\d+)?")


CPP_FRAME = re.compile(r"\s*@\s+0x[0-9a-f]+\s")  # a line of a C++ stack trace (absl's)
# what a worker prints when a collective, a barrier or a heartbeat waited for its peers in vain
WAITED = re.compile(r"[Tt]imed? ?out|DEADLINE_EXCEEDED|[Hh]eartbeat")


def drop_gloo_chatter(line):
    """``line`` without gloo's connection messages or pieces of them ('' if nothing is left)."""
    if not any(p in line for p in ("[Gloo] Rank", "is connected to", "peer ranks")):
        return line
    rest = GLOO_PIECES.sub("", line)
    return "" if re.fullmatch(r"[\d\s]*", rest) else rest


MAX_PROCESSES = 64  # workers share one machine's cores; more would only thrash it
TIMEOUT_STATUS = 124  # the exit status of a job stopped by --timeout (as timeout(1) uses)


class LaunchError(InputError):
    """A launcher argument is wrong; the message says which and how to fix it."""


HELP = "run a command as K cooperating JAX processes on this machine"
DESCRIPTION = ("Start COMMAND as several JAX processes on this machine (127.0.0.1), each with "
               "its own devices, joined by jax.distributed. The command calls "
               "d2l_multi.initialize_distributed() first.")
USAGE = "python -m d2l_multi launch [options] -- COMMAND [ARGS ...]"


def configure(p: argparse.ArgumentParser) -> None:
    """The launcher's options (its COMMAND is split off first: ``split_command``)."""
    p.usage = USAGE
    p.add_argument("--processes", "-n", type=int, default=2, metavar="K",
                   help=f"number of worker processes, 1..{MAX_PROCESSES} (default 2)")
    p.add_argument("--devices-per-process", type=int, default=1, metavar="D",
                   help="devices of each process: that many GPUs each where there are "
                        "K x D GPUs, else simulated CPU devices (default 1)")
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


_VALUED = {"--processes", "-n", "--devices-per-process", "--port", "--heartbeat-timeout",
           "--collective-timeout", "--grace-period", "--timeout"}  # options with a value


def split_command(argv):
    """Split ``[options] [--] COMMAND ...`` into the launcher's options and the command: it
    starts after a '--' that comes first, or at the first word that is not an option (so the
    command's own '--' stays with it)."""
    for i, arg in enumerate(argv):
        if arg == "--":
            return argv[:i], argv[i + 1:]
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
        except PermissionError:
            raise LaunchError(f"--port {port}: ports below 1024 need root (or the "
                              f"CAP_NET_BIND_SERVICE capability); pick one from 1024 to "
                              f"65535, or leave --port out to get a free one") from None
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


_KEY = secrets.token_bytes(32)  # this process's key to the secrets of the launches it starts


def job_env(process_id, num_processes, devices_per_process, port, heartbeat_timeout=10,
            collective_timeout=120):
    """The variables the launcher sets for worker ``process_id`` of the job on ``port``. The
    job's secret is derived from the port and a key that only this process holds."""
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
            SECRET_ENV: hmac.new(_KEY, str(port).encode(), "sha256").hexdigest()[:32],
            LAUNCHER_PID_ENV: str(os.getpid()),
            "JAX_NUM_CPU_DEVICES": str(devices_per_process),
            "PYTHONUNBUFFERED": "1"}  # so lines arrive as they are printed


def cpu_fallback(total_devices, environ=None, gpus=None):
    """``{"JAX_PLATFORMS": "cpu"}`` where this machine has GPUs, but fewer than the
    ``total_devices`` a job asks for: its workers then simulate CPU devices, as
    ``d2l.simulate_devices`` does for a notebook. ``{}`` where JAX_PLATFORMS is set already,
    where there is no GPU, or where there are enough (``gpus``: counted when None)."""
    from ..distributed import _gpus_here
    env = os.environ if environ is None else environ
    gpus = _gpus_here(env) if gpus is None else gpus
    if env.get("JAX_PLATFORMS", "").strip() or not gpus or gpus >= total_devices:
        return {}
    return {"JAX_PLATFORMS": "cpu"}


def worker_env(process_id, num_processes, devices_per_process, port, *args, **kwargs):
    """The environment of a worker: the launcher's own, ``job_env(...)`` and, where this
    machine has fewer GPUs than the job has devices, ``JAX_PLATFORMS=cpu`` (``cpu_fallback``)."""
    return {**os.environ, **job_env(process_id, num_processes, devices_per_process, port,
                                    *args, **kwargs),
            **cpu_fallback(num_processes * devices_per_process)}


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

    def close(self, release):
        """Let the watchdog exit: without killing anything (``release``: every worker has
        ended), or after killing every worker's process group (some may be left)."""
        if release:
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


def stream(proc, prefix, lock, verbose=False, out=None, on_line=None, closed=None):
    """Copy ``proc``'s output line by line to ``out`` (stdout), each line after ``prefix``;
    call ``on_line(line)`` for every line shown. When ``out``'s reader has gone (a closed pipe,
    as after ``| head``), set the event ``closed`` and keep reading, so the worker never
    blocks on a full pipe."""
    out, frames = out or sys.stdout, 0
    for raw in iter(proc.stdout.readline, b""):
        line = raw.decode("utf-8", errors="replace").rstrip("\n")
        if not verbose:
            line = drop_gloo_chatter(line)
            if CPP_FRAME.match(line):  # C++ stack frames: one line says they were left out
                frames += 1
                if frames > 1:
                    continue
                line = "    (its C++ stack frames are left out; --verbose shows them)"
            if not line.strip():
                continue
        if closed is not None and closed.is_set():
            continue
        with lock:
            try:
                out.write(f"{prefix} {line}\n")
                out.flush()
            except BrokenPipeError:
                if closed is None:
                    raise
                closed.set()
                continue
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


def _stopped(proc):
    """True while ``proc`` is stopped (SIGSTOP, Ctrl-Z), read from /proc."""
    try:
        with open(f"/proc/{proc.pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("T", "t")
    except (OSError, IndexError):
        return False


def stop_workers(procs, grace_period, hurry=lambda: False):
    """SIGTERM every worker's process group, wait ``grace_period`` (cut short when ``hurry()``
    turns true), then SIGKILL the rest; return the workers whose process group is still there.

    JAX workers catch SIGTERM as a preemption notice and keep running, so the SIGKILL that
    follows is what usually ends them; the grace period lets other programs clean up.
    """
    for p in procs:
        _signal_group(p, signal.SIGTERM)
    deadline = time.monotonic() + grace_period
    while time.monotonic() < deadline and any(p.poll() is None for p in procs) and not hurry():
        time.sleep(0.05)
    for p in procs:
        _signal_group(p, signal.SIGKILL)  # also any children the worker left behind
    for i, p in enumerate(procs):
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            _log(f"p{i} (pid {p.pid}) did not end 10 s after SIGKILL; giving up on it")
    deadline = time.monotonic() + 5  # the killed group's other members are reaped by others
    while time.monotonic() < deadline and any(_group_alive(p) for p in procs):
        time.sleep(0.05)
    return [p for p in procs if _group_alive(p)]


def _log(message):
    try:
        sys.stderr.write(f"[launch] {message}\n")  # one write: lines of workers cannot cut it
        sys.stderr.flush()
    except OSError:  # nobody reads the launcher's messages any more
        pass


class _Signals:
    """SIGINT, SIGTERM and SIGHUP to the launcher, recorded in ``received`` instead of raised,
    so that no clean-up is cut short (only the main thread can receive them)."""
    STOP = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self):
        self.received, self._old = [], {}

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            self._old = {s: signal.signal(s, self._record) for s in self.STOP}
        return self

    def _record(self, signum, frame):
        self.received.append(signum)

    def __exit__(self, *exc):
        for s, handler in self._old.items():
            signal.signal(s, handler)

    def since(self, count):
        """A function telling whether more than ``count`` signals have come."""
        return lambda: len(self.received) > count


class _Worker:
    """A started worker: its process, its output thread and its last line of output."""

    def __init__(self, index, proc, lock, verbose, closed):
        self.index, self.proc, self.last, self.last_time = index, proc, None, None
        self.recent = collections.deque(maxlen=40)  # (time, line): read after a failure
        self.thread = threading.Thread(target=stream, daemon=True, args=(
            proc, f"[p{index}]", lock, verbose, None, self._saw, closed))
        self.thread.start()

    def _saw(self, line):
        self.last, self.last_time = line, time.monotonic()
        self.recent.append((self.last_time, line))

    def __str__(self):
        return f"p{self.index} (pid {self.proc.pid})"

    def state(self):
        """'still running', 'stopped (SIGSTOP or Ctrl-Z)' or how it ended."""
        if self.proc.poll() is None:
            return "stopped (SIGSTOP or Ctrl-Z)" if _stopped(self.proc) else "still running"
        return describe_exit(self.proc.returncode)

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
        _log(f"  {w} {w.state()}, {w.describe_output(now)}")
    if running:
        silent = min(running, key=lambda w: (w.last_time is not None, w.last_time or 0))
        _log(f"  the job waits on {silent}: it has been silent longest "
             f"({silent.describe_output(now)})")


def _stop(workers, grace_period, signals, expected=0):
    """Stop every worker and wait for their output; a signal beyond the ``expected`` ones
    skips the rest of the grace period. Return the workers that could not be stopped."""
    left = stop_workers([w.proc for w in workers], grace_period, signals.since(expected))
    _join_output(workers, 5)
    return [w for w in workers if w.proc in left]


def _interrupted(workers, grace_period, signals):
    name = signal.Signals(signals.received[0]).name
    _log(f"interrupted by {name}: stopping the workers (another signal skips the grace "
         f"period)")
    left = _stop(workers, grace_period, signals, expected=1)
    _log(f"could not stop {', '.join(map(str, left))}" if left else
         f"stopped all {len(workers)} worker(s)")
    return 128 + signals.received[0]


def _report_failure(workers, first, elapsed, grace_period, signals):
    code = first.proc.returncode
    paused = [w for w in workers if w is not first and _stopped(w.proc)]
    _log(f"worker {first} failed after {elapsed:.1f} s: {describe_exit(code)}; stopping the "
         f"others")
    running = [w for w in workers if w.proc.poll() is None]
    hung = _hung(first, [w for w in running if w not in paused])  # before their last words
    _stop(workers, grace_period, signals)
    for w in workers:
        if w is not first:
            how = "stopped by the launcher" if w in running else "ended on its own"
            _log(f"  {w} {how}: {describe_exit(w.proc.returncode)}")
    cause = ""
    if paused:
        cause = (f", after {', '.join(f'p{w.index}' for w in paused)} had been stopped (SIGSTOP "
                 f"or Ctrl-Z): a stopped worker sends no heartbeat, so its peers count it dead")
    if hung:
        _log(f"FAILED: {hung}; p{first.index} ended waiting for it ({describe_exit(code)})")
    else:
        _log(f"FAILED: worker p{first.index} died first ({describe_exit(code)}){cause}")
    return code if code > 0 else 128 - code


def _hung(first, others):
    """Which of ``others`` (still running) ``first`` waited for in vain, described, when
    ``first``'s last lines say it gave up waiting (a collective, a barrier or a heartbeat timed
    out): the one silent longest. None when the lines say nothing of the kind."""
    waited = next(((t, line) for t, line in reversed(first.recent) if WAITED.search(line)), None)
    if waited is None or not others:
        return None
    before = {w: max((t for t, _ in w.recent if t <= waited[0]), default=None) for w in others}
    silent = min(others, key=lambda w: (before[w] is not None, before[w] or 0))
    quiet = (f"silent for {waited[0] - before[silent]:.0f} s" if before[silent] is not None
             else "silent")
    return (f"{silent} stopped responding ({quiet} when p{first.index} gave up: "
            f"{waited[1].strip()[-90:]!r})")


def _supervise(command, processes, env_of, grace_period, timeout, verbose, watchdog, signals,
               workers):
    """Start the workers (into ``workers``) and wait for the job; return the exit status.
    Stops every worker before it returns or raises."""
    lock, closed, start = threading.Lock(), threading.Event(), time.monotonic()
    try:
        for i in range(processes):
            try:
                proc = start_worker(command, env_of(i))
            except OSError as e:
                _log(f"cannot start {command[0]!r}: {e.strerror}; check the command after '--'")
                _stop(workers, 0, signals)
                return 127
            watchdog.watch(proc.pid)
            workers.append(_Worker(i, proc, lock, verbose, closed))
        _log("started " + ", ".join(f"p{w.index} (pid {w.proc.pid})" for w in workers))
        while True:
            if signals.received:
                return _interrupted(workers, grace_period, signals)
            if closed.is_set():
                _log("the reader of the output has gone (a closed pipe, as after '| head'); "
                     "stopping the workers")
                _stop(workers, grace_period, signals)
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                return 128 + signal.SIGPIPE
            codes = [w.proc.poll() for w in workers]
            failed = [w for w, c in zip(workers, codes) if c not in (None, 0)]
            if failed or all(c == 0 for c in codes):
                break
            if timeout is not None and time.monotonic() - start > timeout:
                _report_timeout(workers, timeout)
                _stop(workers, grace_period, signals)
                _log(f"FAILED: stopped by --timeout {timeout:g} s")
                return TIMEOUT_STATUS
            time.sleep(0.05)
    except BaseException:
        _stop(workers, grace_period, signals)
        raise
    elapsed = time.monotonic() - start
    if failed:
        return _report_failure(workers, failed[0], elapsed, grace_period, signals)
    _clean_up_after_success(workers, grace_period)
    _log(f"all {processes} worker(s) finished OK in {elapsed:.1f} s")
    return 0


def run(command, processes, devices_per_process, port=None, heartbeat_timeout=10,
        collective_timeout=120, grace_period=2.0, verbose=False, timeout=None):
    """Run ``command`` as ``processes`` workers; return 0, the failing worker's code, 124
    after ``timeout`` seconds, 128 + the signal when interrupted (130 for Ctrl-C), or 141 when
    the reader of the output has gone."""
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
    if cpu_fallback(processes * devices_per_process):
        _log(f"this machine has fewer GPUs than the {processes * devices_per_process} "
             f"devices asked for: the workers simulate CPU devices (JAX_PLATFORMS=cpu)")

    def env_of(i):
        return worker_env(i, processes, devices_per_process, port, heartbeat_timeout,
                          collective_timeout)
    workers, watchdog = [], Watchdog()
    try:
        with _Signals() as signals:
            return _supervise(command, processes, env_of, grace_period, timeout, verbose,
                              watchdog, signals, workers)
    finally:  # the watchdog kills what is left, unless every worker's group is gone
        watchdog.close(release=not any(_group_alive(w.proc) for w in workers))


def run_command(args: argparse.Namespace) -> int:
    """Run ``args.command`` (the words after the options) under the launcher."""
    command = args.command
    check_args(args, command)
    if args.port is not None:
        check_port(args.port)
    problem = command_problem(command)
    if problem:
        print(f"python -m d2l_multi launch: error: {problem}", file=sys.stderr)
        return 127
    return run(command, args.processes, args.devices_per_process, args.port,
               args.heartbeat_timeout, args.collective_timeout, args.grace_period,
               args.verbose, args.timeout)
