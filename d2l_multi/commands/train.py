"""``python -m d2l_multi train``: LeNet data parallel on 1 and N devices, table and plots."""
import argparse
import contextlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile
import time

from .. import _checks as check
from .. import smoke_switch
from ..errors import Error, InputError
from ..hardware import cpu_threads
from .common import check_out, describe_machine, only_run, path_argument, positive, save_atomic

HELP = "LeNet data parallel on 1 and N devices: a table and two plots (the default command)"
DESCRIPTION = ("Train LeNet on Fashion-MNIST data-parallel on 1 and N devices (N simulated CPU "
               "devices when there are fewer than N accelerators).")


class RunApartError(Error, ChildProcessError):
    """A device count trained in a process of its own failed or ran too long."""


def _device_counts(text):
    counts = []
    for part in text.split(","):
        part = part.strip()
        if part == "all":
            counts.append("all")
            continue
        try:
            n = int(part)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"device counts are integers or 'all', got {part!r}") from None
        if n < 1:
            raise argparse.ArgumentTypeError(f"device counts must be positive, got {n}")
        counts.append(n)
    return counts


def configure(p: argparse.ArgumentParser) -> None:
    """The arguments of ``python -m d2l_multi train``."""
    p.add_argument("--devices", type=_device_counts, default=[1, "all"],
                   help="comma-separated device counts to compare (default: 1,all)")
    p.add_argument("--epochs", type=positive(int), default=10,
                   help="epochs per run (default 10)")
    p.add_argument("--batch-size", type=positive(int), default=256,
                   help="global batch size on one device (default 256)")
    p.add_argument("--lr", type=positive(float), default=0.1,
                   help="learning rate on one device (default 0.1)")
    p.add_argument("--scale-batch", action="store_true",
                   help="as d2l's concise section does, multiply the batch size and the learning "
                        "rate by the number of devices (default: the same global batch on every "
                        "device count, so runs differ only in how the work is split)")
    p.add_argument("--cpu-devices", type=positive(int), default=None,
                   help="CPU devices to simulate when there is no accelerator, every run "
                        "in this one process (default: the largest count in --devices if at "
                        "most 8, else 8, and each smaller count trains in a process of its own "
                        "that simulates only its devices: XLA:CPU sizes one thread pool for "
                        "all the simulated devices, which slows a run on fewer of them)")
    p.add_argument("--out", type=path_argument, default=pathlib.Path("runs"),
                   help="folder for the PNG plots and results.json (default: runs/)")


class _Progress:
    """A data module whose training loader shows a tqdm bar per epoch, e.g.
    ``8 devices · epoch 3/10``."""

    def __init__(self, data, label, num_epochs):
        self.data, self.label, self.num_epochs = data, label, num_epochs

    def get_dataloader(self, train, *args, **kwargs):
        loader = self.data.get_dataloader(train, *args, **kwargs)
        return _EpochBar(loader, self.label, self.num_epochs) if train else loader


class _EpochBar:
    def __init__(self, loader, label, num_epochs):
        self.loader, self.label, self.num_epochs, self.epoch = loader, label, num_epochs, 0

    def __iter__(self):
        from tqdm.auto import tqdm
        self.epoch += 1
        desc = f"{self.label} · epoch {self.epoch}/{self.num_epochs}"
        return iter(tqdm(self.loader, desc=desc, leave=False, file=sys.stderr))


def _plots(runs, out, machine):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for r in runs:
        ax.plot([h["epoch"] for h in r["history"]], [h["test_acc"] for h in r["history"]],
                marker="o", label=f"{r['devices']} dev, batch {r['batch_size']}")
    ax.set(xlabel="epoch", ylabel="test accuracy", title="LeNet on Fashion-MNIST")
    ax.grid(), ax.legend()
    save_atomic(out / "accuracy.png", lambda tmp: fig.savefig(tmp, dpi=120,
                                                              bbox_inches="tight"))
    fig, ax = plt.subplots(figsize=(5, 3.5))
    labels = [f"{r['devices']} dev\nbatch {r['batch_size']}" for r in runs]
    ax.bar(labels, [r["sec_per_epoch"] for r in runs])
    ax.set(ylabel="sec/epoch (after epoch 1)", title=f"LeNet epoch time on {machine}")
    save_atomic(out / "sec_per_epoch.png", lambda tmp: fig.savefig(tmp, dpi=120,
                                                                   bbox_inches="tight"))
    plt.close("all")


def _run_here(d2l, n, batch, lr, epochs):
    """Train on ``n`` of this process's devices; return the run's row of results.json."""
    platform = d2l.describe(d2l.devices(n))
    data = _Progress(d2l.FashionMNIST(batch), platform, epochs)
    _, history, animator = d2l.train(n, batch, lr, epochs, data)
    import matplotlib.pyplot as plt
    plt.close(animator.fig)
    later = [h["sec"] for h in history[1:]] or [history[0]["sec"]]  # after compilation
    return {"devices": n, "batch_size": batch, "lr": lr, "history": history,
            "sec_per_epoch": sum(later) / len(later), "test_acc": history[-1]["test_acc"],
            "platform": platform}


def _run_apart(n, batch, lr, epochs, limit, environ):
    """Train on ``n`` simulated CPU devices in a Python process of its own (this command with
    ``--cpu-devices n``, in ``environ``: the environment before this process simulated its
    devices, which sized its thread pool), waiting at most ``limit`` seconds; its progress bar
    shows here. Ctrl-C, SIGTERM or SIGHUP stop it; so does this process's death."""
    from .launch import Watchdog, _Signals, describe_exit, stop_workers
    who = f"the {n}-device run in a process of its own"
    sys.stdout.flush()  # this process's lines first
    with tempfile.TemporaryDirectory(prefix="d2l_multi-train-") as tmp, \
            open(os.path.join(tmp, "output.txt"), "w+") as output, _Signals() as signals:
        watchdog = Watchdog()  # kills the run if this process dies first
        proc = overran = None
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "d2l_multi", "train", "--devices", str(n),
                 "--cpu-devices", str(n), "--epochs", str(epochs), "--batch-size",
                 str(batch), "--lr", repr(lr), "--out", tmp],
                stdin=subprocess.DEVNULL, stdout=output, start_new_session=True,
                env={**environ, "JAX_PLATFORMS": "cpu"})  # signals: recorded, below
            watchdog.watch(proc.pid)
            deadline = time.monotonic() + limit
            while proc.poll() is None and not signals.received \
                    and time.monotonic() < deadline:
                try:
                    proc.wait(timeout=0.2)
                except subprocess.TimeoutExpired:
                    pass
        finally:
            if proc is not None and proc.poll() is None:  # stopped, or too slow
                overran = not signals.received
                stop_workers([proc], grace_period=5)
            watchdog.close(release=proc is None or proc.poll() is not None)
        if signals.received:
            raise KeyboardInterrupt
        if overran:
            raise RunApartError(
                f"{who} (pid {proc.pid}) did not finish within {limit:.0f} s and was "
                f"stopped; pass --cpu-devices to train every count in one process")
        if proc.returncode != 0:
            raise RunApartError(
                f"{who} failed ({describe_exit(proc.returncode)})"
                + ("; its messages are above" if proc.returncode > 0 else ""))
        run = json.loads(pathlib.Path(tmp, "results.json").read_text())["runs"][0]
        output.seek(0)
        for line in output.read().splitlines():
            if line.startswith("test acc: "):
                print(line)
    return {**run, "process_devices": n}


RESULTS = ("results.json", "accuracy.png", "sec_per_epoch.png")  # what a run writes
RESULTS_BYTES = 2_000_000  # about as much


def run(args: argparse.Namespace) -> int:
    """Train on each device count of ``args.devices``; print the table, save plots and
    results.json into ``args.out`` (checked first, and held by this run alone); return the
    exit status."""
    check_out(args.out, RESULTS, RESULTS_BYTES)
    with contextlib.ExitStack() as held:
        if args.out.is_dir():  # another run may hold it: refuse at once, before JAX starts
            held.enter_context(only_run(args.out))
        return _run(args, held)


def _run(args, held):
    started = time.perf_counter()
    import d2l_multi as d2l

    from .book import versions
    pinned, environ = args.cpu_devices is not None, dict(os.environ)
    if not pinned:  # the largest count asked for, at most 8
        args.cpu_devices = 8 if "all" in args.devices else min(max(args.devices), 8)
    d2l.simulate_devices(args.cpu_devices)
    available = d2l.devices()
    counts = list(dict.fromkeys(len(available) if n == "all" else n for n in args.devices))
    configs = []
    for n in counts:
        if n > len(available) and available[0].platform == "cpu":
            raise InputError(f"asked for {n} devices but only {len(available)} simulated CPU "
                             f"devices exist; pass --cpu-devices {n} to simulate more")
        d2l.devices(n)
        scale = n if args.scale_batch else 1
        configs.append((n, args.batch_size * scale, args.lr * scale))
        check.divisible(configs[-1][1], n)
    out = args.out
    if not out.is_dir():  # a new folder: created, and held, once the settings are checked
        held.enter_context(only_run(out))
    smoke = " [SMOKE RUN: not results]" if smoke_switch.smoke() else ""
    cpu, stack = describe_machine(), versions()  # printed now, saved with the results
    print(f"machine: {cpu}\n{stack}")
    print(f"LeNet on Fashion-MNIST, {args.epochs} epochs, {d2l.describe(available)} "
          f"available{smoke}")
    # On simulated CPU devices XLA sizes one thread pool for all of them, which slows a run
    # on fewer devices: unless --cpu-devices asks for that pool, such a run gets a process of
    # its own that simulates just its devices. The largest count runs here, first, and bounds
    # the wait for the others.
    apart = {n for n, _, _ in configs if available[0].platform == "cpu" and not pinned
             and n < len(available)}
    runs, here_sec = {}, None
    for n, batch, lr in sorted(configs, key=lambda c: c[0] in apart):
        if n in apart:
            runs[n] = _run_apart(n, batch, lr, args.epochs, 600 + 10 * (here_sec or 0),
                                 environ)
            continue
        started_run = time.perf_counter()
        runs[n] = {**_run_here(d2l, n, batch, lr, args.epochs),
                   "process_devices": len(available),
                   "cpu_threads": max(cpu_threads(), len(available))
                   if available[0].platform == "cpu" else None}
        here_sec = time.perf_counter() - started_run
    runs = [runs[n] for n, _, _ in configs]
    print(f"\n{'devices':>7} {'batch':>6} {'lr':>6} {'sec/epoch':>9} {'test acc':>8}")
    for r in runs:
        print(f"{r['devices']:7d} {r['batch_size']:6d} {r['lr']:6.2f} "
              f"{r['sec_per_epoch']:9.2f} {r['test_acc']:8.3f}")
    print("sec/epoch averages the epochs after the first, which includes compilation.")
    cores = os.cpu_count()
    if available[0].platform == "cpu" and len(available) > 1:
        machine = f"{len(available)} simulated CPU devices sharing {cores} cores"
        print(f"The {machine}: the timings show overhead, not multi-device speedup.")
        fewest = min(counts)
        if not pinned and fewest < len(available):
            print("The runs on fewer devices ran in processes of their own, each simulating "
                  "only its devices.")
        elif fewest < len(available):
            print(f"The runs on fewer devices share the thread pool XLA:CPU sizes for "
                  f"{len(available)}, which slows their steps; for the time of {fewest} "
                  f"device{'s' * (fewest > 1)} in a process of its own, run `python -m "
                  f"d2l_multi train --devices {fewest}`.")
    elif available[0].platform == "cpu":
        machine = f"1 CPU device ({cores} cores)"
    else:
        machine = d2l.describe(available)
    _plots(runs, out, machine)
    wall = time.perf_counter() - started
    print(f"wall time {wall:.0f} s (the whole command: imports, data, compilation, "
          f"training, evaluation)")
    text = json.dumps({"smoke": smoke_switch.smoke(), "epochs": args.epochs, "machine": machine,
                       "cpu": cpu, "versions": stack,
                       "wall_sec": wall, "runs": runs}, indent=1)
    results = save_atomic(out / "results.json", lambda tmp: pathlib.Path(tmp).write_text(text))
    print(f"plots: {out / 'accuracy.png'}, {out / 'sec_per_epoch.png'}; results: {results}")
    return 0
