"""A notebook kernel in a bubblewrap sandbox, for grading submissions (docs/classroom.md).

nbgrader's autograde runs in the teacher's process, with the course (gradebook, the grader's
checks); only the kernel that runs a submission's code starts inside ``bwrap``: a kernel spec
whose command is bubblewrap, talking to nbgrader over ZeroMQ ``ipc`` sockets in a folder the
sandbox shares (the kernel has no network). In the sandbox:

* a new root holding only the runtime, read-only: ``/usr`` (and the ``/bin``, ``/lib``
  links), ``/etc``, Python and its virtual environment, the ``d2l_multi`` package (alone, at
  ``/opt/d2l_multi``, never its checkout) and the data folder; plus the job's folder
  (the submission's working folder, writable) and nothing else of the machine: no course, no
  other submission, no host ``/tmp`` or sockets;
* a fresh ``/proc`` of its own PID namespace, a read-only ``/sys``, a private ``/tmp``, its
  own network (loopback only), IPC and UTS namespaces;
* an unprivileged user (uid ``UID``, no capabilities, ``no_new_privs``) even when the teacher
  is root;
* limits (``prlimit``): address space, processes of that user, CPU seconds, file size.
"""
import json
import os
import pathlib
import re
import shutil
import sys

UID = 61000  # the sandbox's user; each job adds its number, so process limits are per job
LIMITS = {"memory": 6 * 2**30, "processes": 256, "cpu": 900, "file_size": 2**30}
REPORT = ".d2l-kernel"  # where the kernel's wrapper writes its exit status and CPU times


def available():
    """Why bubblewrap cannot sandbox here, or None when it can."""
    if not sys.platform.startswith("linux"):
        return "bubblewrap sandboxes need Linux"
    missing = [t for t in ("bwrap", "prlimit", "setpriv") if shutil.which(t) is None]
    if missing:
        return (f"{', '.join(missing)} not found: install bubblewrap (Debian/Ubuntu: apt-get "
                f"install bubblewrap) and util-linux")
    return None


def _runtime_paths():
    """The read-only folders a Python kernel needs: the system, Python, the environment."""
    paths = {pathlib.Path(p) for p in ("/usr", "/etc")}
    for p in (sys.prefix, sys.base_prefix, sys.exec_prefix,
              os.path.dirname(os.path.realpath(sys.executable))):
        paths.add(pathlib.Path(os.path.realpath(p)))
    paths.add(pathlib.Path(os.path.realpath(os.path.dirname(os.path.dirname(sys.executable)))))
    keep = []
    for p in sorted(paths, key=lambda p: len(p.parts)):
        if p.exists() and not any(p.is_relative_to(k) for k in keep) and p != pathlib.Path("/"):
            keep.append(p)
    return keep


def package_folder():
    """The folder of this ``d2l_multi`` package (mounted alone in the sandbox)."""
    return pathlib.Path(__file__).resolve().parents[1]


# Run as root inside the sandbox: hand the connection file to the kernel's user, then run the
# kernel as that user with the limits, and write down how it ended (a limit's signal) and
# its CPU time (``times``: the shell's, then its children's, user and system).
WRAPPER = r"""
uid=$1 mem=$2 nproc=$3 cpu=$4 fsize=$5 report=$6 python=$7 conn=$8
chown "$uid:$uid" "$conn" "$(dirname "$conn")"
setpriv --reuid="$uid" --regid="$uid" --clear-groups --inh-caps=-all --bounding-set=-all \
  --no-new-privs prlimit --as="$mem" --nproc="$nproc" --cpu="$cpu" --fsize="$fsize" \
  --core=0 -- "$python" -m ipykernel_launcher -f "$conn"
echo "$?" > "$report"
times >> "$report"
"""


def command(job, uid, limits=None, data=None, env=None):
    """The argv that runs ``python -m ipykernel_launcher -f {connection_file}`` in the
    sandbox for the job folder ``job``, as user ``uid``."""
    limits = {**LIMITS, **(limits or {})}
    job = pathlib.Path(job).resolve()
    bindir = os.path.dirname(os.path.abspath(sys.executable))
    argv = ["bwrap", "--die-with-parent", "--new-session", "--unshare-pid", "--unshare-net",
            "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try", "--hostname", "sandbox",
            "--proc", "/proc", "--dev", "/dev", "--ro-bind", "/sys", "/sys",
            "--perms", "1777", "--tmpfs", "/tmp", "--perms", "1777", "--tmpfs", "/dev/shm"]
    for link, target in (("/bin", "usr/bin"), ("/lib", "usr/lib"), ("/lib64", "usr/lib64"),
                         ("/sbin", "usr/sbin")):
        if os.path.islink(link):
            argv += ["--symlink", target, link]
        elif os.path.isdir(link):
            argv += ["--ro-bind", link, link]
    made = {pathlib.Path("/")}
    for p in _runtime_paths() + [job]:
        for parent in reversed(p.parents):  # bwrap would make them 0700: the user could not
            if parent not in made:          # reach what is inside
                argv += ["--perms", "0755", "--dir", str(parent)]
                made.add(parent)
    for p in _runtime_paths():
        argv += ["--ro-bind", str(p), str(p)]
    argv += ["--perms", "0755", "--dir", "/opt", "--perms", "0755", "--dir", "/opt/d2l_multi",
             "--ro-bind", str(package_folder()), "/opt/d2l_multi/d2l_multi"]
    if data:
        argv += ["--ro-bind", str(pathlib.Path(data).resolve()), "/opt/d2l_multi_data"]
    env = {"HOME": str(job / "work"), "TMPDIR": "/tmp", "PATH": f"{bindir}:/usr/bin:/bin",
           "LANG": "C.UTF-8", "PYTHONPATH": "/opt/d2l_multi", "PYTHONNOUSERSITE": "1",
           "MPLBACKEND": "Agg", "KERAS_BACKEND": "jax", **(env or {})}
    if data:
        env["D2L_MULTI_DATA"] = "/opt/d2l_multi_data"
    argv += ["--bind", str(job), str(job), "--chdir", str(job / "work"), "--clearenv"]
    for key, value in sorted(env.items()):
        argv += ["--setenv", key, str(value)]
    argv += ["--", "sh", "-c", WRAPPER, "d2l-sandbox", str(uid), str(limits["memory"]),
             str(limits["processes"]), str(limits["cpu"]), str(limits["file_size"]),
             str(job / REPORT), sys.executable, "{connection_file}"]
    return argv


def install_kernel(where, job, uid, name, limits=None, data=None, env=None):
    """A kernel spec ``name`` in ``where/kernels`` (put ``where`` on JUPYTER_PATH) whose
    kernel runs in the sandbox of the job folder ``job``; interrupts go as messages (no signal
    crosses the sandbox). Returns ``where``."""
    folder = pathlib.Path(where) / "kernels" / name
    folder.mkdir(parents=True)
    (folder / "kernel.json").write_text(json.dumps({
        "argv": command(job, uid, limits, data, env), "display_name": "Python 3 (sandbox)",
        "language": "python", "interrupt_mode": "message"}))
    return pathlib.Path(where)


def kernel_report(job):
    """(the kernel's exit status or None, its CPU seconds) from the job folder's report."""
    try:
        lines = (pathlib.Path(job) / REPORT).read_text().split("\n")
    except OSError:
        return None, 0.0
    status = int(lines[0]) if lines[0].strip().isdigit() else None
    seconds = 0.0
    for part in (lines[2].split() if len(lines) > 2 else []):
        m = re.fullmatch(r"(\d+)m([\d.]+)s", part)
        if m:
            seconds += 60 * int(m.group(1)) + float(m.group(2))
    return status, seconds
