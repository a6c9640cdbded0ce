"""``python -m d2l_multi.mp_train``: the chapter's data-parallel LeNet as one of K processes.

Run it under the launcher (or on a cluster, or alone: it works in all three):

    python -m d2l_multi launch --processes 2 --devices-per-process 4 -- \\
        python -m d2l_multi.mp_train --epochs 10 --out runs/mp

Every process runs this same program (SPMD). Each one loads only its rows of every global
batch, ``jax.make_array_from_process_local_data`` turns them into one global batch sharded over
all devices of all processes, and a jitted SGD step on replicated parameters makes XLA insert
the cross-process allreduce. Metrics come out of jitted reductions, so every process holds the
same numbers; only process 0 prints them and writes the log, the plot and ``params.npz``.
Checkpoints are written by all processes together (Orbax: each writes its shards, process 0
commits), so a crash mid-save never leaves a checkpoint that looks complete.
"""
import argparse
import functools
import json
import os
import pathlib
import signal
import sys

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

import d2l_multi as d2l


def parser():
    p = argparse.ArgumentParser(prog="python -m d2l_multi.mp_train",
                                description="Data-parallel LeNet on Fashion-MNIST across "
                                            "all devices of all processes.")
    p.add_argument("--epochs", type=int, default=None,
                   help="epochs (default 10; 1 with D2L_MULTI_SMOKE=1)")
    p.add_argument("--batch-size", type=int, default=256, help="global batch size (256)")
    p.add_argument("--lr", type=float, default=0.2, help="learning rate (0.2)")
    p.add_argument("--num-train", type=int, default=None,
                   help="training examples (default all 60000; 1024 in smoke mode)")
    p.add_argument("--num-val", type=int, default=None,
                   help="test examples (default all 10000; 512 in smoke mode)")
    p.add_argument("--steps", type=int, default=None,
                   help="stop after this many SGD steps in all (default: run every epoch)")
    p.add_argument("--out", type=pathlib.Path, default=None,
                   help="folder for log.json, train.png, params.npz and checkpoints/ "
                        "(written by process 0; checkpoints by all processes together)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the latest complete checkpoint in OUT/checkpoints")
    p.add_argument("--crash-at-step", type=int, default=None,
                   help="for the fault demo: the last process kills itself at this step")
    return p


def data_mesh():
    """A 1-D mesh named 'data' over every device of every process."""
    return jax.make_mesh((jax.device_count(),), ("data",),
                         axis_types=(jax.sharding.AxisType.Auto,))


def init_params(mesh, seed=0):
    """LeNet's parameters, shaped as ``d2l.init_lenet_params``'s, replicated over ``mesh``.

    NumPy draws them (He-normal weights, zero biases) from ``seed``: every process draws the
    same numbers, so the replicas start equal without any communication, and no JAX
    random-number kernel has to be compiled first.
    """
    shapes = jax.eval_shape(lambda: d2l.init_lenet_params(jax.random.key(0)))
    rng = np.random.default_rng(seed)

    def draw(shape):
        if len(shape) == 1:
            return np.zeros(shape, np.float32)
        fan_in = int(np.prod(shape[:-1]))  # HWIO kernels and (in, out) matrices alike
        return (rng.standard_normal(shape) * np.sqrt(2 / fan_in)).astype(np.float32)

    replicated = NamedSharding(mesh, P())
    return [jax.make_array_from_process_local_data(replicated, draw(s.shape)) for s in shapes]


@functools.partial(jax.jit, donate_argnums=0)
def sgd_step(params, X, y, lr):
    """One SGD step on a global batch; XLA turns the gradient's batch mean into an allreduce."""
    loss, grads = jax.value_and_grad(d2l.loss_fn)(params, X, y)
    return [p - lr * g for p, g in zip(params, grads)], loss


@jax.jit
def weighted_correct(params, X, y, w):
    """Correct predictions and examples in a batch, counting only rows of weight 1."""
    return ((jnp.argmax(d2l.lenet(params, X), axis=1) == y) * w).sum(), w.sum()


def evaluate(params, mesh, X, y, batch_size):
    """Test accuracy over all processes: every process gets the same global number."""
    correct = total = 0.0
    for Xl, yl, wl in d2l.process_batches(X, y, batch_size):
        c, n = weighted_correct(params, *d2l.global_batch(mesh, Xl, yl, wl))
        correct, total = correct + float(c), total + float(n)  # replicated scalars
    return correct / total


def log(message, everyone=False):
    """Print on process 0 only (on every process with ``everyone``), flushed at once."""
    if everyone or jax.process_index() == 0:
        print(message, flush=True)


def train(args):
    """Train on every device of every process; return (params, history)."""
    mesh, is_main = data_mesh(), jax.process_index() == 0
    d2l.check_divisible(args.batch_size, jax.device_count())
    epochs = args.epochs or d2l.pick(10, 1)
    data = d2l.FashionMNIST(args.batch_size, num_train=args.num_train or d2l.pick(None, 1024),
                            num_val=args.num_val or d2l.pick(None, 512))
    params, start_epoch, ckpt = init_params(mesh), 0, None
    if args.out is not None:
        ckpt = Checkpoints(args.out / "checkpoints")
        if args.resume and ckpt.latest() is not None:
            start_epoch = ckpt.latest()
            params = ckpt.restore(start_epoch, params)
            log(f"resumed from the checkpoint of epoch {start_epoch}")
    animator = d2l.Animator("epoch", "value", legend=["train loss", "test acc"],
                            xlim=[1, max(epochs, 2)]) if is_main and args.out else None
    history, timer, step = [], d2l.Timer(), 0
    for epoch in range(start_epoch, epochs):
        timer.start()
        loss_sum, num_batches = 0.0, 0
        for X, y, _ in d2l.process_batches(*data.train, args.batch_size, shuffle=True,
                                           epoch=epoch):
            Xg, yg = d2l.global_batch(mesh, X, y)
            if step == 0:
                log(f"process {jax.process_index()}: local batch {X.shape} -> global batch "
                    f"{Xg.shape}, {len(Xg.addressable_shards)} of its "
                    f"{len(Xg.sharding.device_set)} shards here", everyone=True)
            params, loss = sgd_step(params, Xg, yg, args.lr)
            # float() waits for the step: with gloo and several CPU devices per process,
            # letting many steps queue up can deadlock their allreduces (JAX 0.10.2)
            loss_sum, num_batches, step = loss_sum + float(loss), num_batches + 1, step + 1
            if args.crash_at_step == step and jax.process_index() == jax.process_count() - 1:
                log(f"process {jax.process_index()}: crashing on purpose at step {step}",
                    everyone=True)
                os.kill(os.getpid(), signal.SIGKILL)
            if args.steps is not None and step >= args.steps:
                break
        train_loss = loss_sum / num_batches  # losses are replicated scalars: global means
        sec = timer.stop()
        acc = evaluate(params, mesh, *data.val, args.batch_size)
        history.append({"epoch": epoch + 1, "steps": step, "train_loss": train_loss,
                        "test_acc": acc, "sec": sec})
        log(f"epoch {epoch + 1}: loss {train_loss:.3f}, test acc {acc:.3f}, {sec:.1f} sec "
            f"({jax.device_count()} devices in {jax.process_count()} processes)")
        if animator is not None:
            animator.add(epoch + 1, (train_loss, acc))
        if ckpt is not None:
            ckpt.save(epoch + 1, params)
        if args.steps is not None and step >= args.steps:
            break
    if ckpt is not None:
        ckpt.close()
    if is_main and args.out is not None:
        (args.out / "log.json").write_text(json.dumps(history, indent=1))
        animator.save(args.out / "train.png")
        np.savez(args.out / "params.npz", *[np.asarray(p) for p in params])
    return params, history


class Checkpoints:
    """Orbax checkpoints of the replicated parameters, one per epoch, the last two kept.

    Every process calls ``save``: each writes the shards it owns and process 0 commits the
    step by renaming its temporary folder, so a step that a crash interrupted never shows up
    in ``latest()``.
    """

    def __init__(self, directory):
        import orbax.checkpoint as ocp
        self.ocp = ocp
        pathlib.Path(directory).mkdir(parents=True, exist_ok=True)
        self.manager = ocp.CheckpointManager(
            pathlib.Path(directory).absolute(),
            options=ocp.CheckpointManagerOptions(max_to_keep=2))

    def latest(self):
        """The newest committed step, or None."""
        return self.manager.latest_step()

    def save(self, step, params):
        """Save ``params`` as ``step`` and wait until the step is committed."""
        self.manager.save(step, args=self.ocp.args.StandardSave(params))
        self.manager.wait_until_finished()

    def restore(self, step, like):
        """Read ``step`` back with the shapes and shardings of ``like``."""
        abstract = jax.tree.map(self.ocp.utils.to_shape_dtype_struct, like)
        return self.manager.restore(step, args=self.ocp.args.StandardRestore(abstract))

    def close(self):
        self.manager.wait_until_finished()
        self.manager.close()


def main(argv=None):
    args = parser().parse_args(argv)
    process, num_processes = d2l.initialize_distributed()  # before any JAX computation
    log(f"process {process} of {num_processes}: {jax.local_device_count()} local "
        f"{jax.default_backend()} devices of {jax.device_count()} (pid {os.getpid()})",
        everyone=True)
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
