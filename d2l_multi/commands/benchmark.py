"""``python -m d2l_multi benchmark [lenet | profile | collectives | predict | models] [options]``:
measurements behind docs/benchmarks.md. Each prints the machine (CPU, cores, load, OS, versions,
devices).

lenet (the default)  One Fashion-MNIST epoch of LeNet (batch 256, 234 steps; ``--steps`` times
                     fewer and scales up) for the straightforward formulation of d2l's text
                     (pmap, NCHW, batches copied from the host every step; with XLA:CPU's
                     default libraries and with the chapter's flags) and the chapter's paths
                     (NHWC, ``d2l.conv2d``; pmap, or jit + shardings with the epoch on the
                     devices), on 1 and N devices, and PyTorch eager on one CPU (one thread per
                     core, NCHW and channels-last) when it is installed. ``--rounds`` rounds
                     time every row in turn: minimum and median.
profile              LeNet's step part by part (convolutions forward, input and kernel
                     gradients, dense layers, elementwise work, the update, the allreduce) from
                     JAX's profiler, beside torch.profiler's parts of PyTorch's step; the
                     host-to-device copy of a batch; the step on N devices.
collectives          psum, all_gather, psum_scatter and ppermute on 2, 4 and 8 devices from
                     2 KB up: median time, spread, algorithm and bus bandwidth (nccl-tests'
                     definitions), and the alpha-beta fit of each (notebook 07a).
predict              LeNet's data-parallel step (jit + shardings, global batch fixed) measured
                     on 1, 2, 4, 8 devices next to the cost model's prediction (notebook 07b).
models               One SGD step of LeNet and of ResNet-18 on one device of each kind the
                     machine has (its CPU as one device, and its first GPU or TPU): ms/step,
                     images/s, sec/epoch, the step's FLOPs (XLA's count) and the FLOP rate.
"""
import argparse
import functools
import os
import platform
import statistics
import time

from .. import _checks as check
from .. import smoke_switch
from ..errors import InputError
from ..hardware import set_cpu_compiler_flags

EPOCH_IMAGES = 60000
SUBCOMMANDS = ("lenet", "profile", "collectives", "predict", "models")
COLLECTIVE_NAMES = ("psum", "all_gather", "psum_scatter", "ppermute")


def _positive(name, value, example):
    if value < 1:
        raise InputError(f"{name} must be a positive integer, e.g. {name} {example}; got {value}")
    return value


def _counts(name, text, least, example):
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise InputError(f"{name} takes comma-separated integers, e.g. {name} {example}; "
                         f"got {text!r}") from None
    if min(counts) < least:
        raise InputError(f"{name}: every count must be at least {least}, e.g. {name} "
                         f"{example}; got {text}")
    return list(dict.fromkeys(counts))  # each once, in the order given


def _machine():
    import jax
    import jaxlib

    from .common import describe_machine
    devices = jax.devices()
    return "\n".join([
        f"machine: {describe_machine()}",
        f"python {platform.python_version()}, jax {jax.__version__}, jaxlib {jaxlib.__version__}, "
        f"devices: {len(devices)} x {devices[0].device_kind}"])


# --- lenet: where an epoch's time goes ------------------------------------------------------

def xla_cpu_defaults():
    """Compiler options that give one program XLA:CPU's default use of YNNPACK back, in a process
    where ``d2l.set_cpu_compiler_flags`` turned it off; ``{}`` where that flag was not set."""
    from importlib import metadata

    version = metadata.version("jaxlib")
    if not version.startswith(("0.10.", "0.11.")) or not set_cpu_compiler_flags({}, version):
        return {}
    # jaxlib 0.10.2's defaults; with them 0.11.2 compiles LeNet's gradient to the same program
    # as with no flag (compared as text)
    types = ("REDUCE", "INDIVIDUAL_DOT", "INDIVIDUAL_CONVOLUTION")
    return {"xla_cpu_experimental_ynn_fusion_type":
            ",".join(f"LIBRARY_FUSION_TYPE_{t}" for t in types)}


def _lenet_nchw(params, X):
    import jax
    from jax import lax
    W1, b1, W2, b2, W3, b3, W4, b4 = params

    def conv(X, W, b):
        Y = lax.conv_general_dilated(X, W, (1, 1), "VALID",
                                     dimension_numbers=("NCHW", "OIHW", "NCHW"))
        return Y + b[:, None, None]

    def pool(X):
        return lax.reduce_window(X, 0.0, lax.add, (1, 1, 2, 2), (1, 1, 2, 2), "VALID") / 4

    h = pool(jax.nn.relu(conv(X, W1, b1)))
    h = pool(jax.nn.relu(conv(h, W2, b2)))
    h = h.reshape(h.shape[0], -1)
    return jax.nn.relu(h @ W3 + b3) @ W4 + b4


def _batch_fits(batch, X):
    """Raise an InputError unless one batch fits in the training images loaded (the smoke
    switch keeps only a sample of them)."""
    if batch > len(X):
        sample = " (the smoke switch keeps a sample)" if smoke_switch.smoke() else ""
        raise InputError(f"--batch-size {batch} is larger than the {len(X)} training images "
                         f"loaded{sample}; use at most {len(X)}")


def _nth_batch(X, y, i, batch):
    """The ``i``-th batch of the epoch ``X, y`` (counting round the epoch again)."""
    i %= len(X) // batch
    return X[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch]


def straightforward(n, X, y, batch, compiler_options=None):
    """d2l's text in JAX: pmap step, NCHW, params stacked per device, host batches each step;
    compiled with ``compiler_options`` (e.g. ``xla_cpu_defaults()``)."""
    import jax
    import numpy as np
    import optax

    import d2l_multi as d2l
    params = d2l.init_lenet_params(jax.random.key(0))
    params = [p.transpose(3, 2, 0, 1) if p.ndim == 4 else p for p in params]  # HWIO -> OIHW
    params = d2l.replicate(params, d2l.devices(n))
    X = np.ascontiguousarray(X.transpose(0, 3, 1, 2))                        # NHWC -> NCHW

    @functools.partial(jax.pmap, axis_name="d", in_axes=(0, 0, 0, None))
    def step(params, X, y, lr):
        loss = lambda p: optax.softmax_cross_entropy_with_integer_labels(
            _lenet_nchw(p, X), y).mean()
        loss_value, grads = jax.value_and_grad(loss)(params)
        grads = jax.lax.pmean(grads, "d")
        return [p - lr * g for p, g in zip(params, grads)], loss_value
    compiled = []

    def run(i, state):
        Xb, yb = d2l.split_batch(*_nth_batch(X, y, i, batch), n)
        if not compiled:
            compiled.append(step.lower(state, Xb, yb, 0.1).compile(compiler_options or {}))
        return compiled[0](state, Xb, yb, 0.1)
    return params, run


def chapter_pmap(n, X, y, batch):
    """The chapter's d2l.train path: NHWC, d2l.conv2d, d2l.train_batch (pmap)."""
    import jax

    import d2l_multi as d2l
    params = d2l.replicate(d2l.init_lenet_params(jax.random.key(0)), d2l.devices(n))

    def run(i, state):
        return d2l.train_batch(state, *_nth_batch(X, y, i, batch), n, 0.1)
    return params, run


def chapter_no_allreduce(n, X, y, batch):
    """The chapter's pmap step without its allreduce (``lax.pmean``): each device takes its own
    SGD step. Not a data-parallel step; the difference to ``chapter_pmap`` is the allreduce."""
    import jax

    import d2l_multi as d2l

    def device_step(params, X, y, lr):
        loss, grads = jax.value_and_grad(d2l.loss_fn)(params, X, y)
        return [p - lr * g for p, g in zip(params, grads)], loss
    devices = d2l.devices(n)
    step = jax.pmap(device_step, axis_name="devices", in_axes=(0, 0, 0, None),
                    devices=devices)
    params = d2l.replicate(d2l.init_lenet_params(jax.random.key(0)), devices)

    def run(i, state):
        return step(state, *d2l.split_batch(*_nth_batch(X, y, i, batch), n), 0.1)
    return params, run


def chapter_jit(n, X, y, batch):
    """jit + NamedSharding: params replicated, the epoch's batches put on the devices once."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    import d2l_multi as d2l
    mesh = d2l.device_mesh((n,))
    params = jax.device_put(d2l.init_lenet_params(jax.random.key(0)), NamedSharding(mesh, P()))
    steps = len(X) // batch
    shard = NamedSharding(mesh, P(None, "data"))
    Xs = jax.device_put(X[:steps * batch].reshape(steps, batch, *X.shape[1:]), shard)
    ys = jax.device_put(y[:steps * batch].reshape(steps, batch), shard)

    @functools.partial(jax.jit, donate_argnums=0)
    def step(params, Xs, ys, i):
        loss, grads = jax.value_and_grad(d2l.loss_fn)(params, Xs[i], ys[i])
        return [p - 0.1 * g for p, g in zip(params, grads)], loss

    def run(i, state):
        return step(state, Xs, ys, i % steps)
    return params, run


class _JaxRow:
    """A JAX formulation ready to time: its state survives between rounds."""

    def __init__(self, make, n, X, y, batch, warmup=3):
        import jax
        self.state, self.run = make(n, X, y, batch)
        self.step = 0
        self.time(warmup)
        jax.block_until_ready(self.state)

    def time(self, steps):
        import jax
        t = time.perf_counter()
        for _ in range(steps):
            self.state, loss = self.run(self.step, self.state)
            self.step += 1
        jax.block_until_ready((self.state, loss))
        return (time.perf_counter() - t) / steps


def torch_threads():
    """PyTorch's intra-op threads for the baseline: one per core this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


class _TorchRow:
    """LeNet in PyTorch eager, SGD, on one CPU device; NCHW or channels-last."""

    def __init__(self, X, y, batch, channels_last, warmup=3):
        import torch
        from torch import nn
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Conv2d(1, 20, 3), nn.ReLU(), nn.AvgPool2d(2),
                                 nn.Conv2d(20, 50, 5), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten(),
                                 nn.Linear(800, 128), nn.ReLU(), nn.Linear(128, 10))
        self.X = torch.from_numpy(X.transpose(0, 3, 1, 2).copy())
        if channels_last:
            self.net = self.net.to(memory_format=torch.channels_last)
            self.X = self.X.contiguous(memory_format=torch.channels_last)
        self.y = torch.from_numpy(y.astype("int64"))
        self.opt = torch.optim.SGD(self.net.parameters(), lr=0.1)
        self.loss_fn = nn.CrossEntropyLoss()
        self.batch, self.num_batches, self.step = batch, len(X) // batch, 0
        self.time(warmup)

    def time(self, steps):
        b = self.batch
        t = time.perf_counter()
        for _ in range(steps):
            i = self.step % self.num_batches
            self.opt.zero_grad()
            loss = self.loss_fn(self.net(self.X[i * b:(i + 1) * b]), self.y[i * b:(i + 1) * b])
            loss.backward()
            self.opt.step()
            self.step += 1
        return (time.perf_counter() - t) / steps


def _configure_lenet(p):
    p.add_argument("--devices", type=int, default=8,
                   help="N for the multi-device rows (simulated on CPU; default 8)")
    p.add_argument("--steps", type=int, default=None,
                   help="steps to time per row and round (default: a whole epoch, 234; 10 in "
                        "smoke mode)")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds over all rows, each timing every row once; the table gives the "
                        "minimum and the median (default 3; 1 in smoke mode)")
    p.add_argument("--batch-size", type=int, default=256, help="global batch (default 256)")


def lenet_main(args):
    _positive("--devices", args.devices, 8)
    _positive("--batch-size", args.batch_size, 256)
    _positive("--rounds", args.rounds, 3)
    if args.steps is not None:
        _positive("--steps", args.steps, 60)
    import d2l_multi as d2l
    check.divisible(args.batch_size, args.devices)
    epoch_steps = EPOCH_IMAGES // args.batch_size
    if epoch_steps < 1:
        raise InputError(f"--batch-size {args.batch_size} is larger than an epoch of "
                         f"{EPOCH_IMAGES} images; use at most {EPOCH_IMAGES}")
    d2l.simulate_devices(args.devices)
    d2l.devices(args.devices)
    print(_machine())
    print(_torch_version())
    print(f"XLA_FLAGS: {os.environ.get('XLA_FLAGS', '')}")
    data = d2l.FashionMNIST(args.batch_size)
    X, y = data.train
    _batch_fits(args.batch_size, X)
    steps = min(args.steps or smoke_switch.pick(epoch_steps, 10), epoch_steps)
    rounds = smoke_switch.shrink(args.rounds, 1)
    print(f"timing {steps} steps of batch {args.batch_size} per row in each of {rounds} rounds; "
          f"sec/epoch = time per step x {epoch_steps}"
          + (" [SMOKE RUN]" if smoke_switch.smoke() else ""))
    defaults = xla_cpu_defaults()
    formulations = [
        ("straightforward (d2l text): pmap, NCHW, host batches, XLA:CPU defaults",
         functools.partial(straightforward, compiler_options=defaults)),
        ("straightforward (d2l text) with d2l.simulate_devices' XLA flags", straightforward),
        ("chapter d2l.train: pmap, NHWC, d2l.conv2d", chapter_pmap),
        ("chapter jit + NamedSharding, data on device", chapter_jit)]
    if not defaults:  # the first two rows would be the same
        formulations.pop(0)
    rows = [(name, f"{n} dev", _JaxRow(make, n, X, y, args.batch_size))
            for name, make in formulations for n in dict.fromkeys((1, args.devices))]
    if args.devices > 1:  # what the allreduce adds to the chapter's step
        rows.append((NO_ALLREDUCE, f"{args.devices} dev",
                     _JaxRow(chapter_no_allreduce, args.devices, X, y, args.batch_size)))
    try:
        import torch
        torch.set_num_threads(torch_threads())
        rows += [(f"PyTorch eager, {layout}", "1 CPU", _TorchRow(X, y, args.batch_size, cl))
                 for layout, cl in (("NCHW", False), ("channels-last", True))]
    except ImportError:
        pass
    samples, cpu = {id(row): [] for *_, row in rows}, {id(row): [] for *_, row in rows}
    for r in range(rounds):  # every row once per round: each sees the machine alike
        for name, dev, row in rows:
            start = time.process_time()  # CPU seconds of every thread of this process
            samples[id(row)].append(row.time(steps))
            cpu[id(row)].append((time.process_time() - start) / steps)
        print(f"round {r + 1}/{rounds} done, load average "
              f"{' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    print("\n| formulation | devices | ms/step (min) | CPU ms/step (min) | s/epoch (min) | "
          "s/epoch (median) |\n|---|---|---|---|---|---|")
    results = {}
    for name, dev, row in rows:
        low, mid = min(samples[id(row)]), statistics.median(samples[id(row)])
        results[name, dev] = (low * epoch_steps, mid * epoch_steps)
        print(f"| {name} | {dev} | {1000 * low:.1f} | {1000 * min(cpu[id(row)]):.1f} | "
              f"{low * epoch_steps:.1f} | {mid * epoch_steps:.1f} |")
    print()
    for line in lenet_ratios(results, args.devices):
        print(line)
    return 0


NO_ALLREDUCE = "chapter d2l.train without its allreduce (not data parallel)"


def lenet_ratios(results, n):
    """The comparisons the lenet table is for, as lines of text: ``results`` maps (formulation,
    devices) to (min, median) seconds per epoch."""
    def ratio(a, b):
        return f"{a[1] / b[1]:.2f} (median), {a[0] / b[0]:.2f} (min)"
    chapter = "chapter d2l.train: pmap, NHWC, d2l.conv2d"
    torch = [v for (name, _), v in results.items() if name.startswith("PyTorch")]
    lines = []
    if torch:
        best_torch = min(torch, key=lambda v: v[1])
        best_n = min((v for (name, dev), v in results.items() if name.startswith("chapter")
                      and name != NO_ALLREDUCE and dev == f"{n} dev"), key=lambda v: v[1])
        lines += [f"chapter d2l.train, 1 device / PyTorch eager (faster layout): "
                  f"{ratio(results[chapter, '1 dev'], best_torch)}",
                  f"chapter, best {n}-device row / PyTorch eager (faster layout): "
                  f"{ratio(best_n, best_torch)}"]
    first = next(name for name, _ in results if name.startswith("straightforward"))
    if n > 1:
        lines.append(f"speed-up of chapter d2l.train over {first}, {n} devices: "
                     f"{ratio(results[first, f'{n} dev'], results[chapter, f'{n} dev'])}")
    if (NO_ALLREDUCE, f"{n} dev") in results:
        with_, without = results[chapter, f"{n} dev"], results[NO_ALLREDUCE, f"{n} dev"]
        share = with_[1] - without[1]
        lines.append(f"the allreduce's share of chapter d2l.train's epoch on {n} devices: " + (
            f"{share:.1f} s of {with_[1]:.1f} s (medians)" if share >= 0 else
            f"below the noise (the row without it took {-share:.2f} s longer; medians "
            f"{with_[1]:.1f} and {without[1]:.1f} s)"))
    return lines


def _torch_version(threads=None):
    try:
        import torch
        if threads:
            return f"torch {torch.__version__} ({threads} thread)"
        return f"torch {torch.__version__} ({torch_threads()} threads, one per core)"
    except ImportError:
        return "torch not installed (PyTorch baseline skipped)"


# --- profile: LeNet's step op by op, JAX beside PyTorch -------------------------------------

PARTS = ("convolutions, forward", "convolutions, input gradient",
         "convolutions, kernel gradient", "convolutions, input and kernel gradients",
         "dense layers, forward and backward",
         "elementwise, pooling, loss, reductions, copies", "SGD update", "allreduce (pmean)")
TORCH_OPS = {"aten::mkldnn_convolution": "convolutions, forward",
             "aten::convolution_backward": "convolutions, input and kernel gradients",
             "aten::mm": "dense layers, forward and backward",
             "aten::addmm": "dense layers, forward and backward",
             "aten::add_": "SGD update", "aten::_foreach_add_": "SGD update"}


def hlo_instructions(hlo_text):
    """``{name: (opcode, dims, op_name)}`` for the instructions of a compiled program's entry
    computation, whose thunks on XLA:CPU carry these names. A fusion that holds a convolution
    or a matrix product (one handed to a library such as YNNPACK) counts as that operation."""
    import re
    line_re = re.compile(r"\s+(?:ROOT )?%(\S+) = (.*?) ([a-z][\w-]*)\((.*)")

    def parse(line):
        m = line_re.match(line)
        if not m:
            return None
        name, shape, opcode, rest = m.groups()
        op_name = re.search(r'op_name="([^"]*)"', rest)
        dims = re.match(r"\w+\[([\d,]*)\]", shape)
        return (name, opcode, tuple(int(d) for d in dims.group(1).split(",") if d) if dims
                else (), op_name.group(1) if op_name else "", rest)
    bodies = {m.group(1): m.group(2) for m in
              re.finditer(r"\n%([\w.-]+) [^\n]*\{\n(.*?)\n\}", hlo_text, re.S)}
    table = {}
    for line in hlo_text[hlo_text.index("\nENTRY"):].splitlines()[1:]:
        parsed = parse(line)
        if not parsed:
            continue
        name, opcode, dims, op_name, rest = parsed
        calls = re.search(r"calls=%([\w.-]+)", rest)
        if opcode == "fusion" and calls:
            inner = [parse(l) for l in bodies.get(calls.group(1), "").splitlines()]
            inner = [i for i in inner if i and i[1] in ("convolution", "dot")]
            if inner:
                _, opcode, dims, op_name, _ = inner[-1]
        table[name] = (opcode, dims, op_name)
    return table


def jax_part(opcode, dims, op_name, params_dims):
    """Which part of a training step an instruction of its program belongs to."""
    if opcode.startswith("all-reduce"):
        return "allreduce (pmean)"
    if opcode == "convolution":
        if tuple(sorted(dims)) in params_dims:  # a kernel's shape (some carry no op_name)
            return "convolutions, kernel gradient"
        return ("convolutions, input gradient" if "transpose(" in op_name
                else "convolutions, forward")
    if opcode == "dot":
        return "dense layers, forward and backward"
    if op_name.endswith("/sub") and "jvp" not in op_name:
        return "SGD update"
    return "elementwise, pooling, loss, reductions, copies"


def profile_jax(compiled, args, steps, log_dir):
    """Milliseconds per step of each part of ``compiled`` (a jitted training step), from a trace
    of ``steps`` calls with JAX's profiler: ``{part: ms}``. With an intra-op pool of one thread
    every operation runs to its end inside its own trace event."""
    import glob
    import gzip
    import json

    import jax
    table = hlo_instructions(compiled.as_text())
    kernels = {tuple(sorted(p.shape)) for p in jax.tree.leaves(args[0]) if p.ndim == 4}
    state = args[0]
    jax.block_until_ready(compiled(state, *args[1:]))
    with jax.profiler.trace(log_dir, create_perfetto_trace=True):
        for _ in range(steps):
            state, loss = compiled(state, *args[1:])
        jax.block_until_ready((state, loss))
    trace = sorted(glob.glob(f"{log_dir}/**/perfetto_trace.json.gz", recursive=True))[-1]
    with gzip.open(trace) as f:
        events = json.load(f)
    events = events["traceEvents"] if isinstance(events, dict) else events
    parts = {}
    for e in events:
        if e.get("ph") == "X" and e.get("name") in table:
            part = jax_part(*table[e["name"]], kernels)
            parts[part] = parts.get(part, 0.0) + e.get("dur", 0) / 1000 / steps
    return parts


def profile_torch(row, steps):
    """Milliseconds per step of each part of PyTorch's step (its operators' own CPU time, from
    torch.profiler over ``steps`` steps): ``{part: ms}``."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        row.time(steps)
    parts = {}
    for event in prof.key_averages():
        if event.key.startswith("aten::"):
            part = TORCH_OPS.get(event.key, "elementwise, pooling, loss, reductions, copies")
            parts[part] = parts.get(part, 0.0) + event.self_cpu_time_total / 1000 / steps
    return parts


def copy_cost(host, device):
    """The host-to-device copy's cost, the difference of two step times in seconds; a
    negative difference is the noise between the timings, and said so."""
    copy = 1000 * (host - device)
    return (f"{copy:.2f} ms" if copy >= 0 else
            f"below the noise, the step with NumPy inputs {-copy:.2f} ms faster")


def _configure_profile(p):
    p.add_argument("--batch-size", type=int, default=256, help="batch (default 256)")
    p.add_argument("--steps", type=int, default=20, help="profiled steps (default 20)")
    p.add_argument("--devices", type=int, default=8,
                   help="N: also time one device's share of the batch on N devices "
                        "(default 8)")


def profile_main(args):
    for name, value, example in (("--batch-size", args.batch_size, 256),
                                 ("--steps", args.steps, 20), ("--devices", args.devices, 8)):
        _positive(name, value, example)
    import tempfile

    import d2l_multi as d2l
    check.divisible(args.batch_size, args.devices)
    os.environ["PJRT_NPROC"] = "1"          # XLA:CPU's intra-op pool: one thread
    set_cpu_compiler_flags()            # the chapter's flags, as d2l.simulate_devices sets
    import jax
    jax.config.update("jax_num_cpu_devices", 1)
    print(_machine())
    print(_torch_version(threads=1))
    print(f"XLA_FLAGS: {os.environ.get('XLA_FLAGS', '')}; PJRT_NPROC=1 (one thread)")
    B, steps = args.batch_size, smoke_switch.shrink(args.steps, 2)
    X, y = d2l.FashionMNIST(B).train
    _batch_fits(B, X)

    def step(params, X, y):
        loss, grads = jax.value_and_grad(d2l.loss_fn)(params, X, y)
        return [p - 0.1 * g for p, g in zip(params, grads)], loss
    params = d2l.init_lenet_params(jax.random.key(0))
    batch = jax.device_put((X[:B], y[:B]))
    columns, walls = {}, {}
    with tempfile.TemporaryDirectory() as log_dir:
        for label, options in (("JAX, chapter", {}), ("JAX, XLA:CPU defaults",
                                                      xla_cpu_defaults())):
            if label == "JAX, chapter" or options:
                compiled = jax.jit(step).lower(params, *batch).compile(options)
                columns[label] = profile_jax(compiled, (params, *batch), steps,
                                             f"{log_dir}/{len(columns)}")
                walls[label] = d2l.time_call(compiled, params, *batch, repeat=steps)
    chapter = jax.jit(step)
    share = B // args.devices
    timed = {"host": [], "device": [], "share": []}
    for _ in range(steps):  # in turn: each sees the machine alike
        timed["host"].append(d2l.time_call(chapter, params, X[:B], y[:B], repeat=3))
        timed["device"].append(d2l.time_call(chapter, params, *batch, repeat=3))
        timed["share"].append(d2l.time_call(chapter, params, *jax.device_put(
            (X[:share], y[:share])), repeat=3) * args.devices)
    host, device, shares = (min(timed[k]) for k in ("host", "device", "share"))
    try:
        import torch
        torch.set_num_threads(1)
        for layout, cl in (("NCHW", False), ("channels-last", True)):
            row = _TorchRow(X, y, B, cl)
            columns[f"PyTorch eager, {layout}"] = profile_torch(row, steps)
            walls[f"PyTorch eager, {layout}"] = min(row.time(3) for _ in range(steps))
    except ImportError:
        pass
    names = list(columns)
    print(f"\none core, batch {B}, {steps} steps: milliseconds per step of each part (each "
          f"operation's time as the profiler records it)" +
          (" [SMOKE RUN]" if smoke_switch.smoke() else ""))
    print("| part | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
    parts = [p for p in PARTS if any(p in c for c in columns.values())]
    parts += sorted({p for c in columns.values() for p in c} - set(parts))
    for part in parts:
        print(f"| {part} | " + " | ".join(f"{columns[n].get(part, 0.0):.1f}" if part in
                                          columns[n] else "-" for n in names) + " |")
    print("| all operations | " + " | ".join(f"{sum(columns[n].values()):.1f}" for n in names)
          + " |")
    print("| the step, timed without the profiler | " +
          " | ".join(f"{1000 * walls[n]:.1f}" for n in names) + " |")
    print(f"\nthe chapter's step on one core: {1000 * device:.1f} ms with the batch on the "
          f"device, {1000 * host:.1f} ms with NumPy inputs (the host-to-device copy: "
          f"{copy_cost(host, device)}); {args.devices} steps of {share} images, one "
          f"device's share on {args.devices} devices: {1000 * shares:.1f} ms")
    return 0


# --- collectives: the alpha-beta model ------------------------------------------------------

def _configure_collectives(p):
    p.add_argument("--devices", default="2,4,8", help="device counts (default 2,4,8)")
    p.add_argument("--collectives", default=",".join(COLLECTIVE_NAMES),
                   help=f"which collectives (default {','.join(COLLECTIVE_NAMES)})")
    p.add_argument("--max-mb", type=int, default=32,
                   help="largest message in MB; sizes go from 2 KB by factors of 4 (default 32)")
    p.add_argument("--repeat", type=int, default=5, help="timed samples per point (default 5)")


def collectives_main(args):
    counts = _counts("--devices", args.devices, 2, "2,4,8")
    collectives = list(dict.fromkeys(args.collectives.split(",")))
    unknown = sorted(set(collectives) - set(COLLECTIVE_NAMES))
    if unknown:
        raise InputError(f"--collectives: unknown {', '.join(map(repr, unknown))}; choose from "
                         f"{','.join(COLLECTIVE_NAMES)}")
    _positive("--max-mb", args.max_mb, 32)
    _positive("--repeat", args.repeat, 5)
    import numpy as np

    import d2l_multi as d2l
    d2l.simulate_devices(max(counts))
    d2l.devices(max(counts))
    print(_machine())
    sizes = [2048 * 4 ** i for i in range(12) if 2048 * 4 ** i <= args.max_mb * 2 ** 20]
    rows = d2l.measure_collectives(collectives, counts, sizes, args.repeat)
    smoke = " [SMOKE RUN: not results]" if smoke_switch.smoke() else ""
    print(f"\nmedian of {args.repeat} samples, spread = min-max{smoke}")
    print("| collective | devices | bytes | median µs | spread µs | algbw GB/s | busbw GB/s |\n"
          "|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['collective']} | {r['devices']} | {r['bytes']} | {1e6 * r['seconds']:.1f} | "
              f"{1e6 * r['low']:.1f}-{1e6 * r['high']:.1f} | {r['algbw'] / 1e9:.3f} | "
              f"{r['busbw'] / 1e9:.3f} |")
    print("\nfit t = alpha + n beta (relative least squares); psum also as a ring, "
          "2(k-1) alpha_hop + 2(k-1)/k n beta_link\n"
          "| collective | devices | alpha µs | 1/beta GB/s | largest error | ring alpha_hop µs | "
          "ring 1/beta_link GB/s |\n|---|---|---|---|---|---|---|")
    for collective in collectives:
        for k in counts:
            mine = [r for r in rows if (r["collective"], r["devices"]) == (collective, k)]
            n = np.array([r["bytes"] for r in mine])
            t = np.array([r["seconds"] for r in mine])
            alpha, beta = d2l.fit_alpha_beta(n, t)
            error = np.max(np.abs((alpha + beta * n) / t - 1))
            hop, link = d2l.ring_per_hop(alpha, beta, k)
            ring_text = f"| {1e6 * hop:.1f} | {_bandwidth(link)} |" if collective == "psum" else \
                "| - | - |"
            print(f"| {collective} | {k} | {1e6 * alpha:.1f} | {_bandwidth(beta)} | "
                  f"{100 * error:.0f} % {ring_text}")
    return 0


def _bandwidth(beta):
    return "inf" if beta == 0 else f"{1 / beta / 1e9:.3f}"


# --- predict: the cost model against LeNet's measured step ----------------------------------

def _configure_predict(p):
    p.add_argument("--devices", default="1,2,4,8", help="device counts (default 1,2,4,8)")
    p.add_argument("--batch-size", type=int, default=256, help="global batch (default 256)")
    p.add_argument("--repeat", type=int, default=10, help="timed steps per point (default 10)")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds over the device counts; medians over them (default 3)")


def predict_main(args):
    counts = _counts("--devices", args.devices, 1, "1,2,4,8")
    _positive("--batch-size", args.batch_size, 256)
    _positive("--repeat", args.repeat, 10)
    _positive("--rounds", args.rounds, 3)
    import d2l_multi as d2l
    for k in counts:
        check.divisible(args.batch_size, k)
    d2l.simulate_devices(max(counts))
    d2l.devices(max(counts))
    print(_machine())
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import PartitionSpec as P
    B = args.batch_size
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    on_cpu = d2l.devices()[0].platform == "cpu"  # simulated devices share the cores

    @jax.jit
    def step(params, X, y):
        loss, grads = jax.value_and_grad(d2l.loss_fn)(params, X, y)
        return [p - 0.1 * g for p, g in zip(params, grads)], loss
    params = d2l.init_lenet_params(jax.random.key(0))
    grad_bytes = sum(p.size * p.dtype.itemsize for p in params)
    images = lambda b: (jnp.zeros((b, 28, 28, 1)), jnp.zeros(b, jnp.int32))
    sizes = [4 ** i for i in range(7, 12)]  # 16 KB to 4 MB, around the gradient
    rings = {k: d2l.ring_per_hop(*d2l.fit_alpha_beta(
                 sizes, [np.median(d2l.time_collective("psum", k, n)) for n in sizes]), k)
             for k in counts if k > 1}
    samples = {k: [] for k in counts}
    for _ in range(smoke_switch.shrink(args.rounds, 1)):  # a k's timings see the machine alike
        for k in counts:
            mesh = d2l.device_mesh((k,))
            share = d2l.cpu_time_call(step, params, *images(B // k), repeat=args.repeat)
            many = d2l.cpu_time_call(step, d2l.shard(params, mesh),
                                     *d2l.shard(images(B), mesh, P("data")), repeat=args.repeat)
            samples[k].append((*share, *many))
    print(f"global batch {B}, gradient {grad_bytes} bytes, {cores} cores; medians of "
          f"{smoke_switch.shrink(args.rounds, 1)} rounds of "
          f"{smoke_switch.shrink(args.repeat, 2)} steps")
    print("compute: " + ("k shares of one device's CPU seconds over the cores p the k devices "
                         "kept busy (CPU seconds / wall seconds)" if on_cpu else
                         "one device's share, all devices at once"))
    print("| devices | p | measured ms | predicted ms | error | compute ms | allreduce ms |\n"
          "|---|---|---|---|---|---|---|")
    for k, rows in samples.items():
        share_cpu, share_wall, cpu, measured = np.median(rows, axis=0)
        alpha, beta = rings.get(k, (0.0, 0.0))
        p = cpu / measured if on_cpu else k
        predicted = d2l.predict_step_time(share_cpu if on_cpu else share_wall, k, grad_bytes,
                                          alpha, beta, parallelism=p)
        comm = d2l.predict_step_time(0.0, k, grad_bytes, alpha, beta)  # no compute: the allreduce
        print(f"| {k} | {p:.2f} | {1e3 * measured:.1f} | {1e3 * predicted:.1f} | "
              f"{100 * (predicted / measured - 1):+.0f} % | {1e3 * (predicted - comm):.1f} | "
              f"{1e3 * comm:.2f} |", flush=True)
    return 0


# --- models: one device of each kind --------------------------------------------------------

def _model_steps(width):
    """``{name: (init(key) -> state, step(state, X, y) -> (state, loss))}`` for LeNet and
    ResNet-18 of ``width`` (SGD, learning rate 0.1; BatchNorm in training mode)."""
    import jax
    import optax
    from flax import nnx

    import d2l_multi as d2l

    def lenet_step(params, X, y):
        loss, grads = jax.value_and_grad(d2l.loss_fn)(params, X, y)
        return [p - 0.1 * g for p, g in zip(params, grads)], loss

    def resnet_init(key):
        model = d2l.ResNet18(width=width, rngs=nnx.Rngs(key))
        return nnx.split(model)

    def resnet_step(state, X, y):
        graphdef, variables = state
        model = nnx.merge(graphdef, variables)

        def loss_fn(model):
            return optax.softmax_cross_entropy_with_integer_labels(model(X), y).mean()
        loss, grads = nnx.value_and_grad(loss_fn)(model)
        params = nnx.state(model, nnx.Param)
        nnx.update(model, jax.tree.map(lambda p, g: p - 0.1 * g, params, grads))
        return nnx.split(model), loss
    return {"LeNet": (d2l.init_lenet_params, lenet_step),
            f"ResNet-18 (width {width})": (resnet_init, resnet_step)}


def _configure_models(p):
    p.add_argument("--batch-size", type=int, default=256, help="batch (default 256)")
    p.add_argument("--width", type=int, default=64,
                   help="ResNet-18's channels in its first stage (default 64, as in d2l)")
    p.add_argument("--repeat", type=int, default=10, help="timed steps (default 10)")


def models_main(args):
    for name, value, example in (("--batch-size", args.batch_size, 256),
                                 ("--width", args.width, 64), ("--repeat", args.repeat, 10)):
        _positive(name, value, example)
    import jax
    import jax.numpy as jnp

    import d2l_multi as d2l
    print(_machine())
    from ..hardware import _accelerators
    kinds = [jax.devices("cpu")[0]] + _accelerators()[:1]
    B = args.batch_size
    print(f"batch {B}; median of {smoke_switch.shrink(args.repeat, 2)} steps after a warm-up; "
          f"sec/epoch = ms/step x {EPOCH_IMAGES // B} steps; FLOPs as XLA:CPU counts them")
    print("| model | device | ms/step | images/s | s/epoch | GFLOP/step | TFLOP/s |\n"
          "|---|---|---|---|---|---|---|")
    for name, (init, step) in _model_steps(args.width).items():
        for device in kinds:  # the CPU first: its count of the FLOPs serves every device
            with jax.default_device(device):
                state = init(jax.random.key(0))
                X, y = jnp.zeros((B, 28, 28, 1)), jnp.zeros(B, jnp.int32)
                compiled = jax.jit(step).lower(state, X, y).compile()
                seconds = d2l.time_call(compiled, state, X, y, repeat=args.repeat)
            if device.platform == "cpu":  # XLA:GPU's count leaves out cuDNN's convolutions
                flops = d2l.step_cost(compiled)["flops"]
            print(f"| {name} | {device.device_kind} | {1e3 * seconds:.2f} | {B / seconds:,.0f} | "
                  f"{seconds * (EPOCH_IMAGES // B):.1f} | {flops / 1e9:.1f} | "
                  f"{flops / seconds / 1e12:.3g} |", flush=True)
    return 0


HELP = "where an epoch's time goes; 'benchmark models' times LeNet's and ResNet-18's steps"
DESCRIPTION = ("The measurements behind docs/benchmarks.md; each prints the machine (CPU, cores, "
               "load, OS, versions, devices). BENCHMARK is lenet unless named.")
_DESCRIPTIONS = {
    "lenet": "Where LeNet's epoch time goes, formulation by formulation.",
    "profile": "LeNet's training step part by part on one core: JAX's profiler beside "
               "PyTorch's.",
    "collectives": "Time collectives over message sizes and fit the alpha-beta model.",
    "predict": "LeNet's data-parallel step: measured and predicted.",
    "models": "LeNet and ResNet-18 steps on one device of each kind.",
}


def configure(p: argparse.ArgumentParser) -> None:
    """The benchmarks, each a subcommand with its options; ``lenet`` when none is named."""
    sub = p.add_subparsers(dest="benchmark", metavar="BENCHMARK", title="benchmarks",
                           required=True)
    for name, describe in _DESCRIPTIONS.items():
        q = sub.add_parser(name, help=describe, description=describe)
        globals()[f"_configure_{name}"](q)
        q.set_defaults(main=globals()[f"{name}_main"])


DEFAULT_SUBCOMMAND = "lenet"


def run(args: argparse.Namespace) -> int:
    """Run the benchmark ``args.benchmark``."""
    return args.main(args)
