"""``python -m d2l_multi benchmark [lenet | collectives | predict | models] [options]``: measurements
behind docs/benchmarks.md. Each prints the machine (CPU, cores, load, OS, versions, devices).

lenet (the default)  One Fashion-MNIST epoch of LeNet (batch 256, 234 steps; ``--steps`` times
                     fewer and scales up) for the straightforward formulation of d2l's text
                     (pmap, NCHW, batches copied from the host every step) and the chapter's
                     paths (NHWC, ``d2l.conv2d``; pmap, or jit + shardings with the epoch on the
                     devices), on 1 and N devices, and PyTorch on one CPU when it is installed.
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
import sys
import time

EPOCH_IMAGES = 60000
SUBCOMMANDS = ("lenet", "collectives", "predict", "models")
COLLECTIVE_NAMES = ("psum", "all_gather", "psum_scatter", "ppermute")


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are ValueErrors: one line, exit status 2."""

    def error(self, message):
        raise ValueError(f"{message} (see {self.prog} --help)")


def _positive(name, value, example):
    if value < 1:
        raise ValueError(f"{name} must be a positive integer, e.g. {name} {example}; got {value}")
    return value


def _counts(name, text, least, example):
    try:
        counts = [int(part) for part in text.split(",")]
    except ValueError:
        raise ValueError(f"{name} takes comma-separated integers, e.g. {name} {example}; "
                         f"got {text!r}") from None
    if min(counts) < least:
        raise ValueError(f"{name}: every count must be at least {least}, e.g. {name} "
                         f"{example}; got {text}")
    return counts


def _machine():
    import jax
    import jaxlib
    from .hardware import describe_machine
    devices = jax.devices()
    return "\n".join([
        f"machine: {describe_machine()}",
        f"python {platform.python_version()}, jax {jax.__version__}, jaxlib {jaxlib.__version__}, "
        f"devices: {len(devices)} x {devices[0].device_kind}"])


# --- lenet: where an epoch's time goes ------------------------------------------------------

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


def straightforward(n, X, y, batch):
    """d2l's text in JAX: pmap step, NCHW, params stacked per device, host batches each step."""
    import jax
    import numpy as np
    import optax
    import d2l_multi as d2l
    params = d2l.init_lenet_params(jax.random.key(0))
    params = [p.transpose(3, 2, 0, 1) if p.ndim == 4 else p for p in params]  # HWIO -> OIHW
    params = d2l.replicate(params, d2l.devices(n))
    X = np.ascontiguousarray(X.transpose(0, 3, 1, 2))                        # NHWC -> NCHW
    steps = len(X) // batch

    @functools.partial(jax.pmap, axis_name="d", in_axes=(0, 0, 0, None))
    def step(params, X, y, lr):
        loss = lambda p: optax.softmax_cross_entropy_with_integer_labels(
            _lenet_nchw(p, X), y).mean()
        loss_value, grads = jax.value_and_grad(loss)(params)
        grads = jax.lax.pmean(grads, "d")
        return [p - lr * g for p, g in zip(params, grads)], loss_value

    def run(i, state):
        i %= steps
        Xb, yb = d2l.split_batch(X[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch], n)
        return step(state, Xb, yb, 0.1)
    return params, run


def chapter_pmap(n, X, y, batch):
    """The chapter's d2l.train path: NHWC, d2l.conv2d, d2l.train_batch (pmap)."""
    import jax
    import d2l_multi as d2l
    params = d2l.replicate(d2l.init_lenet_params(jax.random.key(0)), d2l.devices(n))
    steps = len(X) // batch

    def run(i, state):
        i %= steps
        return d2l.train_batch(state, X[i * batch:(i + 1) * batch],
                               y[i * batch:(i + 1) * batch], n, 0.1)
    return params, run


def chapter_jit(n, X, y, batch):
    """jit + NamedSharding: params replicated, the epoch's batches put on the devices once."""
    import jax
    from jax.sharding import NamedSharding, PartitionSpec as P
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


def _time_jax(make, n, X, y, batch, steps, warmup=3):
    import jax
    state, run = make(n, X, y, batch)
    for i in range(warmup):
        state, loss = run(i, state)
    jax.block_until_ready(state)
    t = time.perf_counter()
    for i in range(steps):
        state, loss = run(i, state)
    jax.block_until_ready((state, loss))
    return (time.perf_counter() - t) / steps


def _time_torch(X, y, batch, steps, warmup=3):
    import torch
    from torch import nn
    net = nn.Sequential(nn.Conv2d(1, 20, 3), nn.ReLU(), nn.AvgPool2d(2),
                        nn.Conv2d(20, 50, 5), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten(),
                        nn.Linear(800, 128), nn.ReLU(), nn.Linear(128, 10))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    Xt = torch.from_numpy(X.transpose(0, 3, 1, 2).copy())
    yt = torch.from_numpy(y.astype("int64"))
    loss_fn = nn.CrossEntropyLoss()
    num_batches = len(X) // batch

    def run(i):
        i %= num_batches
        opt.zero_grad()
        loss = loss_fn(net(Xt[i * batch:(i + 1) * batch]), yt[i * batch:(i + 1) * batch])
        loss.backward()
        opt.step()
    for i in range(warmup):
        run(i)
    t = time.perf_counter()
    for i in range(steps):
        run(i)
    return (time.perf_counter() - t) / steps


def lenet_main(argv):
    p = _Parser(prog="python -m d2l_multi benchmark lenet",
                description="Where LeNet's epoch time goes, formulation by formulation.")
    p.add_argument("--devices", type=int, default=8,
                   help="N for the multi-device rows (simulated on CPU; default 8)")
    p.add_argument("--steps", type=int, default=None,
                   help="steps to time per row (default: a whole epoch, 234; 10 in smoke mode)")
    p.add_argument("--batch-size", type=int, default=256, help="global batch (default 256)")
    args = p.parse_args(argv)
    _positive("--devices", args.devices, 8)
    _positive("--batch-size", args.batch_size, 256)
    if args.steps is not None:
        _positive("--steps", args.steps, 60)
    import d2l_multi as d2l
    d2l.check_divisible(args.batch_size, args.devices)
    epoch_steps = EPOCH_IMAGES // args.batch_size
    if epoch_steps < 1:
        raise ValueError(f"--batch-size {args.batch_size} is larger than an epoch of "
                         f"{EPOCH_IMAGES} images; use at most {EPOCH_IMAGES}")
    d2l.simulate_devices(args.devices)
    d2l.devices(args.devices)
    print(_machine())
    print(_torch_version())
    data = d2l.FashionMNIST(args.batch_size)
    X, y = data.train
    steps = min(args.steps or d2l.pick(epoch_steps, 10), epoch_steps)
    print(f"timing {steps} steps of batch {args.batch_size} per row; sec/epoch = "
          f"time per step x {epoch_steps}" + (" [SMOKE RUN]" if d2l.smoke() else ""))
    rows = []
    for name, make in [("straightforward (d2l text): pmap, NCHW, host batches", straightforward),
                       ("chapter d2l.train: pmap, NHWC, d2l.conv2d", chapter_pmap),
                       ("chapter jit + NamedSharding, data on device", chapter_jit)]:
        for n in dict.fromkeys((1, args.devices)):
            sec = _time_jax(make, n, X, y, args.batch_size, steps)
            rows.append((name, f"{n} dev", sec))
            print(f"{name:55} {n} dev: {1000 * sec:7.1f} ms/step {sec * epoch_steps:6.1f} s/epoch",
                  flush=True)
    try:
        sec = _time_torch(X, y, args.batch_size, steps)
        rows.append(("PyTorch eager, NCHW", "1 CPU", sec))
        print(f"{'PyTorch eager, NCHW':55} 1 CPU: {1000 * sec:7.1f} ms/step "
              f"{sec * epoch_steps:6.1f} s/epoch", flush=True)
    except ImportError:
        pass
    print("\n| formulation | devices | ms/step | s/epoch |\n|---|---|---|---|")
    for name, dev, sec in rows:
        print(f"| {name} | {dev} | {1000 * sec:.1f} | {sec * epoch_steps:.1f} |")
    return 0


def _torch_version():
    try:
        import torch
        return f"torch {torch.__version__} ({torch.get_num_threads()} threads)"
    except ImportError:
        return "torch not installed (PyTorch baseline skipped)"


# --- collectives: the alpha-beta model ------------------------------------------------------

def collectives_main(argv):
    p = _Parser(prog="python -m d2l_multi benchmark collectives",
                description="Time collectives over message sizes and fit the alpha-beta model.")
    p.add_argument("--devices", default="2,4,8", help="device counts (default 2,4,8)")
    p.add_argument("--collectives", default=",".join(COLLECTIVE_NAMES),
                   help=f"which collectives (default {','.join(COLLECTIVE_NAMES)})")
    p.add_argument("--max-mb", type=int, default=32,
                   help="largest message in MB; sizes go from 2 KB by factors of 4 (default 32)")
    p.add_argument("--repeat", type=int, default=5, help="timed samples per point (default 5)")
    args = p.parse_args(argv)
    counts = _counts("--devices", args.devices, 2, "2,4,8")
    collectives = args.collectives.split(",")
    unknown = sorted(set(collectives) - set(COLLECTIVE_NAMES))
    if unknown:
        raise ValueError(f"--collectives: unknown {', '.join(unknown)}; choose from "
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
    smoke = " [SMOKE RUN: not results]" if d2l.smoke() else ""
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
            n = np.array([r["bytes"] for r in rows if (r["collective"], r["devices"]) == (collective, k)])
            t = np.array([r["seconds"] for r in rows if (r["collective"], r["devices"]) == (collective, k)])
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

def predict_main(argv):
    p = _Parser(prog="python -m d2l_multi benchmark predict",
                description="LeNet's data-parallel step: measured and predicted.")
    p.add_argument("--devices", default="1,2,4,8", help="device counts (default 1,2,4,8)")
    p.add_argument("--batch-size", type=int, default=256, help="global batch (default 256)")
    p.add_argument("--repeat", type=int, default=10, help="timed steps per point (default 10)")
    p.add_argument("--rounds", type=int, default=3,
                   help="rounds over the device counts; medians over them (default 3)")
    args = p.parse_args(argv)
    counts = _counts("--devices", args.devices, 1, "1,2,4,8")
    _positive("--batch-size", args.batch_size, 256)
    _positive("--repeat", args.repeat, 10)
    _positive("--rounds", args.rounds, 3)
    import d2l_multi as d2l
    for k in counts:
        d2l.check_divisible(args.batch_size, k)
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
    rings = {k: d2l.ring_per_hop(*d2l.fit_alpha_beta(sizes, [np.median(d2l.time_collective("psum", k, n))
                                                 for n in sizes]), k)
             for k in counts if k > 1}
    samples = {k: [] for k in counts}
    for _ in range(d2l.shrink(args.rounds, 1)):  # a k's timings see the machine alike
        for k in counts:
            mesh = d2l.device_mesh((k,))
            share = d2l.cpu_time_call(step, params, *images(B // k), repeat=args.repeat)
            many = d2l.cpu_time_call(step, d2l.shard(params, mesh),
                                     *d2l.shard(images(B), mesh, P("data")), repeat=args.repeat)
            samples[k].append((*share, *many))
    print(f"global batch {B}, gradient {grad_bytes} bytes, {cores} cores; medians of "
          f"{d2l.shrink(args.rounds, 1)} rounds of {d2l.shrink(args.repeat, 2)} steps")
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


def models_main(argv):
    p = _Parser(prog="python -m d2l_multi benchmark models",
                description="LeNet and ResNet-18 steps on one device of each kind.")
    p.add_argument("--batch-size", type=int, default=256, help="batch (default 256)")
    p.add_argument("--width", type=int, default=64,
                   help="ResNet-18's channels in its first stage (default 64, as in d2l)")
    p.add_argument("--repeat", type=int, default=10, help="timed steps (default 10)")
    args = p.parse_args(argv)
    for name, value, example in (("--batch-size", args.batch_size, 256),
                                 ("--width", args.width, 64), ("--repeat", args.repeat, 10)):
        _positive(name, value, example)
    import jax
    import jax.numpy as jnp
    import d2l_multi as d2l
    print(_machine())
    from .hardware import _accelerators
    kinds = [jax.devices("cpu")[0]] + _accelerators()[:1]
    B = args.batch_size
    print(f"batch {B}; median of {d2l.shrink(args.repeat, 2)} steps after a warm-up; "
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


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    command = "lenet"
    if argv and not argv[0].startswith("-"):
        command = argv.pop(0)
    elif argv and argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0
    if command not in SUBCOMMANDS:
        raise ValueError(f"unknown benchmark {command!r}; use one of {', '.join(SUBCOMMANDS)}")
    return {"lenet": lenet_main, "collectives": collectives_main,
            "predict": predict_main, "models": models_main}[command](argv)
