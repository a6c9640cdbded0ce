"""Checkpoints of a sharded train state with Orbax: save while training, restore onto the same or
a different mesh (resharding on load), resume exactly where the run stopped, data included."""
import pathlib

import grain
import jax
import jax.numpy as jnp
import optax
import orbax.checkpoint as ocp
from jax.sharding import NamedSharding, PartitionSpec as P

import d2l_multi as d2l


class CheckpointError(RuntimeError):
    """A checkpoint exists but cannot be read: it is damaged or was not written by Orbax."""


def lenet_specs(axis="model"):
    """LeNet's layouts: the convolutions replicated, the dense layers split over ``axis`` the
    tensor-parallel way (W3's columns with b3, W4's rows)."""
    return [P(), P(), P(), P(), P(None, axis), P(axis), P(axis, None), P()]


def state_specs(optimizer, params, specs):
    """PartitionSpecs of the train state: the parameters' ``specs``, the same for the optimizer's
    moments (they have the parameters' shapes), ``P()`` (replicated) for counters and the step."""
    opt_state = jax.eval_shape(optimizer.init, params)  # shapes only, nothing allocated
    return {"params": specs,
            "opt_state": optax.tree_map_params(optimizer, lambda _, spec: spec, opt_state, specs,
                                               transform_non_params=lambda _: P()),
            "step": P()}


def sharded_train_state(params, optimizer, mesh, specs):
    """The train state ``{'params', 'opt_state', 'step'}`` laid out on ``mesh``."""
    state = {"params": params, "opt_state": optimizer.init(params),
             "step": jnp.zeros((), jnp.int32)}
    return jax.tree.map(lambda x, spec: d2l.shard(x, mesh, spec), state,
                        state_specs(optimizer, params, specs))


def abstract_like(tree, mesh, specs):
    """Shapes and dtypes of ``tree``'s arrays with the layouts ``specs`` on ``mesh``: the target
    that tells Orbax where to put every restored array (no memory is allocated)."""
    def leaf(x, spec):
        d2l.check_spec(spec, mesh, x.shape)
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, spec))
    return jax.tree.map(leaf, tree, specs)


def checkpoint_manager(directory, max_to_keep=3, create=True):
    """An Orbax CheckpointManager keeping the newest ``max_to_keep`` steps under ``directory``
    (``max_to_keep=None, create=False``: one that never writes or deletes anything)."""
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=create)
    handlers = {"state": ocp.StandardCheckpointHandler(),  # how each item is written and read
                "data": grain.checkpoint.CheckpointHandler()}
    return ocp.CheckpointManager(pathlib.Path(directory).absolute(), options=options,
                                 item_handlers=handlers)


def save_checkpoint(manager, step, state, data_iter=None):
    """Save ``state`` (and where the Grain iterator ``data_iter`` is) as ``step``, in the
    background: call ``manager.wait_until_finished()`` before relying on it."""
    items = {"state": ocp.args.StandardSave(state)}
    if data_iter is not None:
        items["data"] = grain.checkpoint.CheckpointSave(data_iter)
    return manager.save(step, args=ocp.args.Composite(**items))


def check_fits(saved, target, where):
    """Raise a ValueError naming the arrays whose paths or shapes differ between two trees."""
    def by_path(tree):  # {'params.4': leaf, ...}, the names Orbax gives the arrays
        return {jax.tree_util.keystr(path, simple=True, separator="."): x
                for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]}
    saved, target = by_path(saved), by_path(target)
    problems = [f"{k}: saved {tuple(saved[k].shape)}, the model has {tuple(target[k].shape)}"
                for k in saved.keys() & target.keys()
                if tuple(saved[k].shape) != tuple(target[k].shape)]
    problems += [f"{k}: saved, but not in the model" for k in saved.keys() - target.keys()]
    problems += [f"{k}: in the model, but not saved" for k in target.keys() - saved.keys()]
    if problems:
        problems.sort(key=lambda p: (not p.startswith("params"), p))  # parameters first
        more = f" and {len(problems) - 3} more" if len(problems) > 3 else ""
        raise ValueError(
            f"the checkpoint {where} does not fit the model: {'; '.join(problems[:3])}{more}. "
            f"Build the model and optimizer as the run that saved it did, or save the new "
            f"model's checkpoints in a fresh directory")


def restore_checkpoint(directory, target, step=None, data_iter=None):
    """Restore ``step`` (default: the latest finished one) from ``directory`` into arrays laid out
    as ``target`` says (``abstract_like``); move ``data_iter`` to where it was. Reads only."""
    directory = pathlib.Path(directory).absolute()
    if not directory.is_dir():
        raise FileNotFoundError(f"no checkpoint directory {directory}; pass the directory "
                                f"the run saved its checkpoints into")
    manager = checkpoint_manager(directory, max_to_keep=None, create=False)  # reads only
    steps = sorted(manager.all_steps())
    if not steps:
        found = sorted(p.name for p in directory.iterdir()) or "nothing"
        raise FileNotFoundError(f"{directory} holds no finished checkpoint (it contains "
                                f"{found}); pass the directory the run saved its checkpoints "
                                f"into, or train from scratch")
    step = steps[-1] if step is None else step
    if step not in steps:
        raise ValueError(f"no checkpoint for step={step!r} in {directory}; it has the "
                         f"steps {steps}")
    where = directory / str(step)

    def damaged(e):
        return CheckpointError(f"cannot read the checkpoint {where} ({type(e).__name__}: "
                               f"{str(e)[:200]}); it is damaged. Restore another step with "
                               f"step=..., one of {steps}")
    try:
        saved = manager.item_metadata(step)["state"].tree
    except Exception as e:  # metadata missing or unreadable
        raise damaged(e) from e
    check_fits(saved, target, where)
    try:
        state = manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(target)))["state"]
    except Exception as e:  # array files missing or unreadable
        raise damaged(e) from e
    if data_iter is not None:
        try:
            manager.restore(step, args=ocp.args.Composite(
                data=grain.checkpoint.CheckpointRestore(data_iter)))
        except (KeyError, ValueError) as e:
            why = "\n".join(line for line in str(e).splitlines()  # drop Grain's hint on repr
                            if not line.startswith("Grain uses")).rstrip(".")
            raise ValueError(f"cannot restore the data iterator from {where}: {why}. Pass a "
                             f"loader built as the run's was (source, batch size, seed, shard "
                             f"options, workers), or data_iter=None") from e
    return state


def train_steps(state, train_step, batches, mesh, num_steps, manager=None, save_every=0):
    """Take ``num_steps`` steps from ``state`` on batches from the iterator ``batches``; every
    ``save_every`` steps save the state and the iterator's position with ``manager``.
    Returns the new state and the losses, one per step."""
    start, losses = int(state["step"]), []
    for i in range(num_steps):
        X, y = next(batches)
        params, opt_state, loss = train_step(state["params"], state["opt_state"],
                                             *d2l.shard_batch(X, y, mesh))
        state = {"params": params, "opt_state": opt_state, "step": state["step"] + 1}
        losses.append(loss)
        if manager is not None and save_every and (start + i + 1) % save_every == 0:
            save_checkpoint(manager, start + i + 1, state, batches)
    if manager is not None:
        manager.wait_until_finished()
    return state, [float(loss) for loss in losses]
