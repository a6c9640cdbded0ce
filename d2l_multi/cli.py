"""``python -m d2l_multi train``: LeNet data parallel on 1 and N devices, table and plots."""
import argparse
import json
import os
import pathlib
import sys
import tempfile


def _positive(kind):
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a {kind.__name__}, got {text!r}")
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be positive, got {text}")
        return value
    return parse


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
            raise argparse.ArgumentTypeError(f"device counts are integers or 'all', got {part!r}")
        if n < 1:
            raise argparse.ArgumentTypeError(f"device counts must be positive, got {n}")
        counts.append(n)
    return counts


def parser():
    p = argparse.ArgumentParser(
        prog="python -m d2l_multi train",
        description="Train LeNet on Fashion-MNIST data-parallel on 1 and N devices "
                    "(N simulated CPU devices when there is no accelerator).")
    p.add_argument("--devices", type=_device_counts, default=[1, "all"],
                   help="comma-separated device counts to compare (default: 1,all)")
    p.add_argument("--epochs", type=_positive(int), default=None,
                   help="epochs per run (default 10; 2 with D2L_MULTI_SMOKE=1)")
    p.add_argument("--batch-size", type=_positive(int), default=256,
                   help="global batch size on one device (default 256)")
    p.add_argument("--lr", type=_positive(float), default=0.1,
                   help="learning rate on one device (default 0.1)")
    p.add_argument("--scale-batch", action="store_true",
                   help="as d2l's concise section does, multiply the batch size and the learning "
                        "rate by the number of devices (default: the same global batch on every "
                        "device count, so runs differ only in how the work is split)")
    p.add_argument("--cpu-devices", type=_positive(int), default=8,
                   help="CPU devices to simulate when there is no accelerator (default 8)")
    p.add_argument("--conv", choices=["best", "lax", "im2col"], default="best",
                   help="convolution implementation (default: the faster for the backend)")
    p.add_argument("--out", type=pathlib.Path, default=pathlib.Path("runs"),
                   help="folder for the PNG plots and results.json (default: runs/)")
    return p


def _save_atomic(fig, path):
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".png")
    os.close(fd)
    try:
        fig.savefig(tmp, dpi=120, bbox_inches="tight")
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)


class _WithProgress:
    """Wraps a data module so training batches show a tqdm progress bar."""

    def __init__(self, data, desc):
        self.data, self.desc = data, desc

    def get_dataloader(self, train, batch_size=None, drop_last=False):
        from tqdm.auto import tqdm
        batches = self.data.get_dataloader(train, batch_size, drop_last)
        return tqdm(batches, desc=self.desc, leave=False, file=sys.stderr) if train else batches


def _plots(runs, out):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(5, 3.5))
    for r in runs:
        ax.plot([h["epoch"] for h in r["history"]], [h["test_acc"] for h in r["history"]],
                marker="o", label=f"{r['devices']} dev, batch {r['batch_size']}")
    ax.set(xlabel="epoch", ylabel="test accuracy", title="LeNet on Fashion-MNIST")
    ax.grid(), ax.legend()
    _save_atomic(fig, out / "accuracy.png")
    fig, ax = plt.subplots(figsize=(5, 3.5))
    labels = [f"{r['devices']} dev\nbatch {r['batch_size']}" for r in runs]
    ax.bar(labels, [r["sec_per_epoch"] for r in runs])
    ax.set(ylabel="sec/epoch (after epoch 1)", title=f"on {runs[0]['platform']}")
    _save_atomic(fig, out / "sec_per_epoch.png")
    plt.close("all")


def train_main(argv):
    args = parser().parse_args(argv)
    import d2l_multi as d2l
    d2l.simulate_devices(args.cpu_devices)
    import numpy as np
    available = len(d2l.devices())
    counts = [available if n == "all" else n for n in args.devices]
    epochs = args.epochs or d2l.pick(10, 2)
    configs = []
    try:
        for n in dict.fromkeys(counts):  # keeps order, drops repeats
            if n > available and d2l.num_gpus() == 0:
                raise ValueError(f"asked for {n} devices but only {available} simulated CPU "
                                 f"devices exist; pass --cpu-devices {n} to simulate more")
            d2l.devices(n)
            scale = n if args.scale_batch else 1
            batch, lr = args.batch_size * scale, args.lr * scale
            d2l.check_divisible(batch, n)
            configs.append((n, batch, lr))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    conv = {"best": d2l.best_conv(), "lax": d2l.conv2d, "im2col": d2l.conv2d_im2col}[args.conv]
    data = d2l.FashionMNIST(args.batch_size, num_train=d2l.pick(None, 4096),
                            num_val=d2l.pick(None, 1024))
    print(f"LeNet on Fashion-MNIST: {len(data.train[0])} training images, {epochs} epochs, "
          f"conv={conv.__name__}, {d2l.describe(d2l.devices())} available"
          + (" [SMOKE RUN: not results]" if d2l.smoke() else ""))
    runs = []
    for n, batch, lr in configs:
        try:
            _, history, animator = d2l.train(
                n, batch, lr, epochs, _WithProgress(data, f"{n} dev"), conv)
        except FloatingPointError as e:
            print(f"error: {e}", file=sys.stderr)
            return 1
        import matplotlib.pyplot as plt
        plt.close(animator.fig)
        later = [h["sec"] for h in history[1:]] or [history[0]["sec"]]
        runs.append({"devices": n, "batch_size": batch, "lr": lr, "history": history,
                     "sec_per_epoch": float(np.mean(later)),
                     "test_acc": history[-1]["test_acc"],
                     "platform": d2l.describe(d2l.devices(n))})
    print(f"\n{'devices':>7} {'batch':>6} {'lr':>6} {'sec/epoch':>9} {'test acc':>8}")
    for r in runs:
        print(f"{r['devices']:7d} {r['batch_size']:6d} {r['lr']:6.2f} "
              f"{r['sec_per_epoch']:9.2f} {r['test_acc']:8.3f}")
    print("sec/epoch averages the epochs after the first, which includes compilation.")
    if d2l.devices()[0].platform == "cpu":
        print("Simulated CPU devices share this machine's cores: the timings show overhead, "
              "not multi-device speedup.")
    args.out.mkdir(parents=True, exist_ok=True)
    _plots(runs, args.out)
    results = args.out / "results.json"
    tmp = results.with_suffix(".json.tmp")
    tmp.write_text(json.dumps({"smoke": d2l.smoke(), "epochs": epochs, "runs": runs}, indent=1))
    os.replace(tmp, results)
    print(f"plots: {args.out / 'accuracy.png'}, {args.out / 'sec_per_epoch.png'}; "
          f"results: {results}")
    return 0
