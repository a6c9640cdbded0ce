"""``python -m d2l_multi.mp_train``: the chapter's data-parallel LeNet as one of K processes.

Run it under the launcher (or on a cluster, or alone: it works in all three):

    python -m d2l_multi launch --processes 2 --devices-per-process 4 -- \\
        python -m d2l_multi.mp_train --epochs 10 --out runs/mp

Every process runs this same program (SPMD). Each one loads only its rows of every global
batch, ``jax.make_array_from_process_local_data`` turns them into one global batch sharded over
all devices of all processes, and a jitted SGD step on replicated parameters makes XLA insert
the cross-process allreduce. Metrics come out of jitted reductions, so every process holds the
same numbers; only process 0 prints them and writes the log, the plot and ``params.npz``.

Checkpoints are labelled by the global step and written by all processes together (Orbax: each
writes its shards, process 0 commits), so a crash mid-save never leaves a checkpoint that looks
complete. The order of the data is a function of (seed, epoch), so a step says where the run
is: epoch ``step // steps_per_epoch``, batch ``step % steps_per_epoch`` of it. ``--resume``
continues exactly there, with any number of processes, after checking that the checkpoint was
written with the same batch size, training set, learning rate and seed. One run at a time
uses an ``--out`` (process 0 holds ``OUT/.lock``). SIGTERM (a preemption notice) saves a
checkpoint at the next step all processes reach, then ends the run with status 143.
"""
import contextlib
import functools
import itertools
import json
import math
import os
import pathlib
import signal

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import d2l_multi as d2l

from .. import _checks as check
from .. import smoke_switch
from ..checkpoint import wait_for_saves
from ..distributed import launcher_settings
from ..errors import DataError, DivergedError, InputError, PathError
from .common import (
    OneLineParser,
    check_out,
    only_run,
    path_argument,
    positive,
    save_atomic,
    writable_dir,
)

PROG = "python -m d2l_multi.mp_train"
TRAIN_SIZE, TEST_SIZE = 60_000, 10_000  # Fashion-MNIST's training and test examples
SEED = 0  # the default seed: the initial parameters and the order of the data
LR = 0.2


def parser():
    p = OneLineParser(prog=PROG, description="Data-parallel LeNet on Fashion-MNIST "
                      "across all devices of all processes.")
    p.add_argument("--epochs", type=positive(int), default=None,
                   help="epochs (default 10; 1 with D2L_MULTI_SMOKE=1)")
    p.add_argument("--batch-size", type=positive(int), default=256,
                   help="global batch size, a multiple of the number of devices (256)")
    p.add_argument("--lr", type=positive(float), default=LR, help=f"learning rate ({LR})")
    p.add_argument("--seed", type=int, default=SEED,
                   help=f"seed of the initial parameters and the order of the data ({SEED})")
    p.add_argument("--num-train", type=positive(int), default=None,
                   help=f"training examples (default all {TRAIN_SIZE}; 1024 in smoke mode)")
    p.add_argument("--num-val", type=positive(int), default=None,
                   help=f"test examples (default all {TEST_SIZE}; 512 in smoke mode)")
    p.add_argument("--steps", type=positive(int), default=None,
                   help="stop after global step STEPS (default: after the last epoch)")
    p.add_argument("--save-every", type=positive(int), default=None, metavar="STEPS",
                   help="save a checkpoint every STEPS global steps (default: at the end of "
                        "every epoch); the last step is always saved")
    p.add_argument("--out", type=path_argument, default=None,
                   help="folder for log.json, train.png, params.npz and checkpoints/ "
                        "(written by process 0; checkpoints by all processes together)")
    p.add_argument("--resume", action="store_true",
                   help="continue from the latest complete checkpoint in OUT/checkpoints")
    p.add_argument("--crash-at-step", type=positive(int), default=None, metavar="STEP",
                   help="for the fault demo: the last process kills itself after global "
                        "step STEP")
    return p


class Plan:
    """The sizes of a run, worked out from its arguments and checked before any JAX work."""

    def __init__(self, args):
        _check_numbers(args)
        _check_seed(args.seed)
        self.epochs = smoke_switch.pick(10, 1) if args.epochs is None else args.epochs
        self.batch_size = args.batch_size
        asked = smoke_switch.pick(None, 1024) if args.num_train is None else args.num_train
        self.num_train = _examples("--num-train", asked, TRAIN_SIZE,
                                   d2l.FashionMNIST.smoke_sizes[0])
        self.num_val = _examples("--num-val",
                                 smoke_switch.pick(None, 512) if args.num_val is None
                                 else args.num_val,
                                 TEST_SIZE, d2l.FashionMNIST.smoke_sizes[1])
        if self.num_train < args.batch_size:
            shrunk = asked is None or asked > self.num_train
            smoke = " (smoke mode keeps at most 2048)" if smoke_switch.smoke() and shrunk else ""
            raise InputError(f"{self.num_train} training examples{smoke} make less than one "
                             f"global batch of --batch-size {args.batch_size}; pass a "
                             f"--batch-size of at most {self.num_train}, or more --num-train")
        self.steps_per_epoch = self.num_train // args.batch_size
        self.last_step = self.epochs * self.steps_per_epoch
        if args.steps is not None:
            self.last_step = min(self.last_step, args.steps)
        self.save_every = args.save_every or self.steps_per_epoch
        if args.crash_at_step is not None and args.crash_at_step > self.last_step:
            raise InputError(f"--crash-at-step {args.crash_at_step} is after the last step of "
                             f"this run ({self.last_step}: {self.epochs} epoch(s) of "
                             f"{self.steps_per_epoch} steps, --steps {args.steps}); pass a "
                             f"step from 1 to {self.last_step}")
        if args.resume and args.out is None:
            raise InputError("--resume needs --out: the checkpoints are in OUT/checkpoints")
        if args.out is not None:
            check_out(args.out, OUTPUTS, OUTPUT_BYTES)
        settings = launcher_settings()
        if settings:  # under the launcher the device count is known before JAX starts
            devices = settings["num_processes"] * settings["devices_per_process"]
            check.divisible(args.batch_size, devices, "--batch-size",
                            f"devices ({settings['num_processes']} processes x "
                            f"{settings['devices_per_process']})")


def _check_numbers(args):
    """The checks of the parser's types, for arguments that did not come through it."""
    for option, kind in [("epochs", int), ("batch_size", int), ("lr", float),
                         ("num_train", int), ("num_val", int), ("steps", int),
                         ("save_every", int), ("crash_at_step", int)]:
        value = getattr(args, option)
        if value is None and option not in ("batch_size", "lr"):
            continue
        kinds = (int,) if kind is int else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds) or not math.isfinite(value) \
                or value <= 0:
            what = "a whole number" if kind is int else "a finite number"
            raise InputError(f"--{option.replace('_', '-')} must be {what} > 0, got {value!r}")


def _check_seed(seed):
    if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2**31:
        raise InputError(f"--seed must be a whole number from 0 to {2**31 - 1}, got {seed!r}")


def _examples(option, asked, available, smoke_size):
    """How many examples a run uses when ``asked`` (None: all ``available``)."""
    if asked is not None and asked > available:
        raise InputError(f"{option} {asked}: Fashion-MNIST has only {available} of those "
                         f"examples; pass at most {available}, or leave {option} out for all")
    n = smoke_switch.shrink(asked, smoke_size)
    return available if n is None else n


OUTPUTS = ("log.json", "train.png", "params.npz")  # the files process 0 writes into --out
OUTPUT_BYTES = 4_000_000  # about what a run writes: those and 3 checkpoints of LeNet


def global_batch(mesh, *local_arrays):
    """Assemble each process's rows into global arrays sharded over ``mesh``'s first axis."""
    check.mesh(mesh)
    if not local_arrays:
        raise InputError("pass the arrays to assemble, e.g. global_batch(mesh, X, y)")
    sharding = NamedSharding(mesh, P(mesh.axis_names[0]))
    return tuple(jax.make_array_from_process_local_data(sharding, a) for a in local_arrays)


def data_mesh():
    """A 1-D mesh named 'data' over every device of every process."""
    return d2l.device_mesh((-1,), ("data",), devices=jax.devices())


def init_params(mesh, seed=SEED):
    """LeNet's parameters (``d2l.init_lenet_params``), replicated over ``mesh``.

    Every process runs the same jitted initialisation from the same ``seed``, so the replicas
    start equal without any communication.
    """
    init = jax.jit(lambda: d2l.init_lenet_params(jax.random.key(seed)),
                   out_shardings=NamedSharding(mesh, P()))
    return init()


def _replicated(mesh, value, dtype=np.int32):
    """A scalar held by every device of ``mesh``."""
    return jax.make_array_from_process_local_data(NamedSharding(mesh, P()),
                                                  np.asarray(value, dtype))


def train_state(params, step, mesh, plan, args):
    """What a checkpoint holds: the parameters, the global step, and the settings that decide
    what the next steps do (the batch size, the training set and the seed decide which data a
    step means; the learning rate, how far it moves)."""
    return {"params": params, "step": _replicated(mesh, step),
            "lr": _replicated(mesh, args.lr, np.float32),
            "data": {"batch_size": _replicated(mesh, plan.batch_size),
                     "num_train": _replicated(mesh, plan.num_train),
                     "seed": _replicated(mesh, args.seed)}}


def abstract_state(mesh):
    """The restore target of ``train_state``: shapes, dtypes, replicated over ``mesh``."""
    scalar = jax.ShapeDtypeStruct((), jnp.int32)
    shapes = {"params": jax.eval_shape(lambda: d2l.init_lenet_params(jax.random.key(0))),
              "step": scalar, "lr": jax.ShapeDtypeStruct((), jnp.float32),
              "data": {"batch_size": scalar, "num_train": scalar, "seed": scalar}}
    return d2l.abstract_like(shapes, mesh, jax.tree.map(lambda _: P(), shapes))


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
        c, n = weighted_correct(params, *global_batch(mesh, Xl, yl, wl))
        correct, total = correct + float(c), total + float(n)  # replicated scalars
    return correct / total


def log(message, everyone=False):
    """Print on process 0 only (on every process with ``everyone``), flushed at once."""
    if everyone or jax.process_index() == 0:
        print(message, flush=True)


def _earlier_log(path, step):
    """The rows of an earlier run's ``log.json`` up to ``step``, where a resumed run goes on.
    A log that is not one this program wrote is refused (and kept), not replaced."""
    if step == 0 or not path.exists():
        return []
    try:
        return [r for r in json.loads(path.read_text()) if r["steps"] <= step]
    except (ValueError, TypeError, KeyError) as e:
        raise DataError(f"{path} is not a log this program wrote ({type(e).__name__}: {e}); "
                        f"move it away to resume, or pass another --out") from None
    except OSError as e:
        raise PathError(f"cannot read {path}: {e.strerror}; move it away to resume, or pass "
                        f"another --out") from None


def _differences(state, args, plan):
    """The settings of this run that differ from those the checkpoint was written with."""
    saved = {"--batch-size": int(state["data"]["batch_size"]),
             "training examples": int(state["data"]["num_train"]),
             "--seed": int(state["data"]["seed"]), "--lr": float(state["lr"])}
    asked = {"--batch-size": args.batch_size, "training examples": plan.num_train,
             "--seed": args.seed, "--lr": float(np.float32(args.lr))}
    return [f"{k} {saved[k]:g} (this run: {asked[k]:g})" for k in saved if saved[k] != asked[k]]


def _start(args, plan, mesh, checkpoints):
    """The parameters and the global step to start from: a fresh run or, with --resume, the
    latest checkpoint (after checking it was written with this run's settings)."""
    steps = d2l.saved_steps(checkpoints) if checkpoints else []
    if steps and not args.resume:
        raise InputError(f"{checkpoints} already holds checkpoints (steps {steps}); pass "
                         f"--resume to continue from step {steps[-1]}, or another --out")
    if steps and steps[-1] > plan.last_step:
        raise InputError(f"the latest checkpoint in {checkpoints} is of step {steps[-1]}, past "
                         f"the last step of this run ({plan.last_step}); raise --epochs or "
                         f"--steps, or pass another --out")
    if not steps:
        if args.resume:
            log(f"no checkpoint in {checkpoints}: starting from step 0")
        return init_params(mesh, args.seed), 0
    try:
        state = d2l.restore_checkpoint(checkpoints, abstract_state(mesh), step=steps[-1])
    except d2l.CheckpointError as e:
        back = f"step {steps[-2]}" if len(steps) > 1 else "step 0"
        raise d2l.CheckpointError(
            f"the latest checkpoint {checkpoints / str(steps[-1])} cannot be used ({e}); "
            f"delete that folder to resume from {back}, or pass another --out") from e
    differences = _differences(state, args, plan)
    if differences:
        raise InputError(f"{checkpoints} was written with {', '.join(differences)}, so its "
                         f"steps do not continue this run; resume with the settings it was "
                         f"written with, or pass another --out")
    step = int(state["step"])
    epoch, batch = divmod(step, plan.steps_per_epoch)
    log(f"resumed from the checkpoint of step {step} (epoch {epoch + 1}, batch {batch} of "
        f"{plan.steps_per_epoch})")
    return state["params"], step


@contextlib.contextmanager
def _only_run(out):
    """Hold ``OUT/.lock`` (process 0, for the whole run): a second run on the same --out is
    refused instead of replacing this run's checkpoints and log."""
    if out is None or jax.process_index() != 0:
        yield
        return
    with only_run(out):
        yield


class Preempted(Exception):
    """The run got SIGTERM, saved where it was and stopped."""


@contextlib.contextmanager
def _preemption():
    """A function ``preempted(step)``: True at the step where the run must save and stop
    after a SIGTERM. In a job, JAX turns SIGTERM into a step that every process reaches
    (``reached_preemption_sync_point``); alone, it is the next step."""
    if jax.distributed.is_initialized():
        from jax.experimental import multihost_utils
        yield multihost_utils.reached_preemption_sync_point
        return
    received = []
    old = signal.signal(signal.SIGTERM, lambda *_: received.append(True))
    try:
        yield lambda step: bool(received)
    finally:
        signal.signal(signal.SIGTERM, old)


def load_data(args, plan=None):
    """The data module of the run (NumPy only: it needs no JAX)."""
    plan = plan or Plan(args)
    return d2l.FashionMNIST(args.batch_size, num_train=plan.num_train, num_val=plan.num_val)


def train(args, data=None):
    """Train on every device of every process; return (params, history of this run)."""
    plan = Plan(args)
    check.divisible(args.batch_size, jax.device_count(), "--batch-size",
                    f"devices ({jax.process_count()} process(es))")
    data = data or load_data(args, plan)
    with _only_run(args.out):
        return _train(args, plan, data)


def _train(args, plan, data):
    mesh, is_main = data_mesh(), jax.process_index() == 0
    checkpoints = args.out / "checkpoints" if args.out is not None else None
    params, step = _start(args, plan, mesh, checkpoints)
    waits = (launcher_settings() or {}).get("collective_timeout")  # a save's, too
    manager = (d2l.checkpoint_manager(checkpoints, max_to_keep=2, timeout=waits) if checkpoints
               else contextlib.nullcontext())
    if args.out is not None:
        writable_dir(args.out)
    earlier = _earlier_log(args.out / "log.json", step) if args.out and is_main else []
    animator = None
    if is_main and args.out is not None:
        animator = d2l.Animator("epoch", "value", legend=["train loss", "test acc"],
                                xlim=[1, max(plan.epochs, 2)])
        for row in earlier:
            animator.add(row["epoch"], (row["train_loss"], row["test_acc"]))
    history, timer, first = [], d2l.Timer(), True
    with manager, _preemption() as preempted:
        while step < plan.last_step:
            epoch, position = divmod(step, plan.steps_per_epoch)
            timer.start()
            losses = []
            batches = d2l.process_batches(*data.train, args.batch_size, shuffle=True,
                                          seed=args.seed, epoch=epoch)
            for X, y, _ in itertools.islice(batches, position, None):
                Xg, yg = global_batch(mesh, X, y)
                if first:
                    log(f"process {jax.process_index()}: local batch {X.shape} -> global "
                        f"batch {Xg.shape}, {len(Xg.addressable_shards)} of its "
                        f"{len(Xg.sharding.device_set)} shards here", everyone=True)
                    first = False
                params, loss = sgd_step(params, Xg, yg, args.lr)
                # a replicated scalar, the global mean; checked every step, so that no
                # non-finite state is ever saved
                loss, step = float(loss), step + 1
                if not math.isfinite(loss):
                    raise DivergedError(
                        f"the loss became {loss} at step {step} (epoch {epoch + 1}) with --lr "
                        f"{args.lr:g}; the learning rate is too large: try a smaller one, "
                        f"e.g. --lr {min(args.lr / 10, LR):g}")
                losses.append(loss)
                if args.crash_at_step == step and \
                        jax.process_index() == jax.process_count() - 1:
                    log(f"process {jax.process_index()}: crashing on purpose at step {step}",
                        everyone=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                stop = preempted(step)
                if checkpoints and (stop or step % plan.save_every == 0 or
                                    step == plan.last_step):
                    check.finite(params, f"the parameters of step {step}")
                    d2l.save_checkpoint(manager, step,
                                        train_state(params, step, mesh, plan, args))
                    wait_for_saves(manager)  # committed before the next step
                if stop:
                    saved = f"saved the checkpoint of step {step}" if checkpoints else \
                        f"stopped at step {step} (no --out: nothing saved)"
                    raise Preempted(f"SIGTERM (a preemption notice): {saved}; run again with "
                                    f"--resume to continue")
                if step >= plan.last_step:
                    break
            sec = timer.stop()
            acc = evaluate(params, mesh, *data.val, args.batch_size)
            history.append({"epoch": epoch + 1, "steps": step,
                            "train_loss": sum(losses) / len(losses), "test_acc": acc,
                            "sec": sec})
            log(f"epoch {epoch + 1}: loss {history[-1]['train_loss']:.3f}, test acc "
                f"{acc:.3f}, {sec:.1f} sec, step {step} ({jax.device_count()} devices in "
                f"{jax.process_count()} process{'es' if jax.process_count() > 1 else ''})")
            if animator is not None:
                animator.add(epoch + 1, (history[-1]["train_loss"], acc))
                _save_log(args.out / "log.json", earlier + history)
    check.finite(params, "the final parameters")
    if animator is not None:
        _save_log(args.out / "log.json", earlier + history)
        save_atomic(args.out / "train.png", animator.save)
        save_atomic(args.out / "params.npz",
                    lambda tmp: np.savez(tmp, *[np.asarray(p) for p in params]))
    return params, history


def _save_log(path, rows):
    save_atomic(path, lambda tmp: pathlib.Path(tmp).write_text(json.dumps(rows, indent=1)))


def _main(argv):
    try:
        args = parser().parse_args(argv)
    except SystemExit as e:  # the parser has printed the error (or --help)
        return e.code
    data = load_data(args)  # wrong values and missing data are refused before JAX starts
    process, num_processes = d2l.initialize_distributed()  # before any JAX computation
    log(f"process {process} of {num_processes}: {jax.local_device_count()} local "
        f"{jax.default_backend()} devices of {jax.device_count()} (pid {os.getpid()})",
        everyone=True)
    try:
        train(args, data)
    except Preempted as e:
        log(f"process {process}: {e}", everyone=True)
        return 128 + signal.SIGTERM
    return 0


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit status. The package's own errors (wrong values, missing
    data, a damaged checkpoint, a diverging run) print one line and give a non-zero status."""
    from . import run
    return run(PROG, _main, argv)


if __name__ == "__main__":
    d2l.exit_worker(main())
