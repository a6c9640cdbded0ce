"""``python -m d2l_multi benchmark``: where LeNet's epoch time goes, side by side.

Times one Fashion-MNIST epoch (batch 256, 234 steps; ``--steps`` times fewer and scales up)
for the straightforward formulation of d2l's text (pmap, NCHW, batches copied from the host
every step) and for the chapter's path (NHWC, the backend's faster convolution, pmap or
jit + shardings), on 1 and N devices, and PyTorch on one CPU device when it is installed.
Prints the machine and versions. Results are recorded in docs/benchmarks.md.
"""
import argparse
import functools
import os
import platform
import sys
import time

EPOCH_IMAGES = 60000


def _machine():
    import jax
    import jaxlib
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if "model name" in line)
    except (OSError, StopIteration):
        pass
    lines = [f"machine: {cpu}, {os.cpu_count()} cores, {platform.system()} {platform.release()}",
             f"python {platform.python_version()}, jax {jax.__version__}, "
             f"jaxlib {jaxlib.__version__}, devices: {jax.devices()}"]
    try:
        import torch
        lines.append(f"torch {torch.__version__} ({torch.get_num_threads()} threads)")
    except ImportError:
        lines.append("torch not installed (PyTorch baseline skipped)")
    return "\n".join(lines)


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

    @functools.partial(jax.pmap, axis_name="d", in_axes=(0, 0, 0, None))
    def step(params, X, y, lr):
        loss = lambda p: optax.softmax_cross_entropy_with_integer_labels(
            _lenet_nchw(p, X), y).mean()
        loss_value, grads = jax.value_and_grad(loss)(params)
        grads = jax.lax.pmean(grads, "d")
        return [p - lr * g for p, g in zip(params, grads)], loss_value

    def run(i, state):
        Xb, yb = d2l.split_batch(X[i * batch:(i + 1) * batch], y[i * batch:(i + 1) * batch], n)
        return step(state, Xb, yb, 0.1)
    return params, run


def chapter_pmap(n, X, y, batch):
    """The chapter's d2l.train path: NHWC, d2l.conv2d, d2l.train_batch (pmap)."""
    import jax
    import d2l_multi as d2l
    params = d2l.replicate(d2l.init_lenet_params(jax.random.key(0)), d2l.devices(n))

    def run(i, state):
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
        return step(state, Xs, ys, i)
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

    def run(i):
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


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m d2l_multi benchmark", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--devices", type=int, default=8,
                   help="N for the multi-device rows (simulated on CPU; default 8)")
    p.add_argument("--steps", type=int, default=None,
                   help="steps to time per row (default: a whole epoch, 234; 10 in smoke mode)")
    p.add_argument("--batch-size", type=int, default=256)
    args = p.parse_args(argv)
    import d2l_multi as d2l
    d2l.simulate_devices(max(args.devices, 1))
    print(_machine())
    try:
        d2l.devices(args.devices)
        d2l.check_divisible(args.batch_size, args.devices)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    data = d2l.FashionMNIST(args.batch_size)
    X, y = data.train
    epoch_steps = EPOCH_IMAGES // args.batch_size
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
