"""Checkpoints of a sharded train state with Orbax: save while training, restore onto the same or
a different mesh (resharding on load), resume exactly where the run stopped, data included.

Every function checks its arguments first and names the value and the fix. A restore reads
only: whatever goes wrong (a damaged or missing checkpoint, arrays of other shapes or dtypes, a
layout the devices cannot take, too little memory, no permission), no file changes.

What Orbax logs that these functions report themselves is dropped only while they run (a read,
or a save until ``wait_for_saves``); importing the module changes no logger and no hook.
"""
import contextlib
import json
import logging
import os
import pathlib
import re
import shutil
import sys
import threading
import traceback
import weakref
from typing import Any

import grain
import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from . import _checks as check
from .errors import (
    AlreadyExistsError,
    CheckpointError,
    InputError,
    NoAccessError,
    NotFoundError,
    PathError,
    TooLargeError,
)


def _is_spec(x):
    return isinstance(x, P) or x is None


def _check_specs(tree, specs):
    spec_leaves = jax.tree.leaves(specs, is_leaf=_is_spec)
    if any(s is None or not isinstance(s, P) for s in spec_leaves):
        bad = next(s for s in spec_leaves if not isinstance(s, P))
        raise InputError(f"specs must hold a PartitionSpec for every array, found {bad!r}; "
                         f"write P() for a replicated array")
    tree_def = jax.tree.structure(tree)
    spec_def = jax.tree.structure(specs, is_leaf=_is_spec)
    if tree_def != spec_def:
        raise InputError(f"specs must have the structure of the arrays, one PartitionSpec per "
                         f"array: the arrays are {tree_def.num_leaves} in {tree_def}, the "
                         f"specs {spec_def.num_leaves} in {spec_def}")


def _check_layouts(tree, specs, mesh):
    check.mesh(mesh)
    _check_specs(tree, specs)
    for x, spec in zip(jax.tree.leaves(tree), jax.tree.leaves(specs, is_leaf=_is_spec)):
        check.spec(spec, mesh, jnp.shape(x))


def lenet_specs(axis="model"):
    """LeNet's layouts: replicated convolutions, dense layers over ``axis``."""
    return [P(), P(), P(), P(), P(None, axis), P(axis), P(axis, None), P()]


def _check_lenet_specs(axis: str = "model") -> None:
    if not isinstance(axis, str) or not axis:
        raise InputError(f"axis must be the name of a mesh axis, e.g. 'model', got {axis!r}")


def state_specs(optimizer, params, specs):
    """The train state's specs: ``specs`` for parameters and moments."""
    opt_state = jax.eval_shape(optimizer.init, params)  # shapes only
    return {"params": specs,
            "opt_state": optax.tree_map_params(
                optimizer, lambda _, spec: spec, opt_state, specs,
                transform_non_params=lambda _: P()),
            "step": P()}


def _check_state_specs(optimizer: optax.GradientTransformation, params: Any, specs: Any) -> None:
    check.optimizer(optimizer)
    _check_specs(params, specs)


def sharded_train_state(params, optimizer, mesh, specs):
    """The train state ``{'params', 'opt_state', 'step'}`` on ``mesh``."""
    state = {"params": params, "opt_state": optimizer.init(params),
             "step": jnp.zeros((), jnp.int32)}
    layouts = state_specs(optimizer, params, specs)
    return jax.tree.map(
        lambda x, spec: jax.device_put(x, NamedSharding(mesh, spec)),
        state, layouts)


def _check_train_state(params: Any, optimizer: optax.GradientTransformation, mesh: Mesh,
                       specs: Any) -> None:
    _check_layouts(params, specs, mesh)


def abstract_like(tree, mesh, specs):
    """The restore target: ``tree``'s shapes and dtypes, placed on ``mesh``."""
    return jax.tree.map(lambda x, spec: jax.ShapeDtypeStruct(
        x.shape, x.dtype, sharding=NamedSharding(mesh, spec)), tree, specs)


def _check_abstract_like(tree: Any, mesh: Mesh, specs: Any) -> None:
    _check_layouts(tree, specs, mesh)


lenet_specs = check.validated(lenet_specs, _check_lenet_specs)
state_specs = check.validated(state_specs, _check_state_specs)
sharded_train_state = check.validated(sharded_train_state, _check_train_state)
abstract_like = check.validated(abstract_like, _check_abstract_like)


def _check_directory(directory, name="directory"):
    return check.folder_path(directory, name).absolute()


class _QuietOrbax(logging.Filter):
    """Drop what Orbax logs that this module reports itself (a read-only manager, missing or
    damaged metadata, the tracebacks of a failed background save)."""

    EXPECTED = ("Given directory is read only", "Metadata file does not exist",
                "Failed to json parse Metadata file",
                'Item "state" was found in the checkpoint, but could not be restored')

    def filter(self, record):
        if record.exc_info and f"{os.sep}orbax{os.sep}" in record.pathname:
            return False
        return not record.getMessage().startswith(self.EXPECTED)


def _is_closed_loop_error(unraisable):
    """Whether ``unraisable`` is a TensorStore callback's error on the event loop Orbax closed
    after a failed read or write (a failure Orbax reports itself)."""
    frames = traceback.extract_tb(unraisable.exc_traceback)
    return (isinstance(unraisable.exc_value, RuntimeError) and bool(frames)
            and frames[-1].name == "_check_closed"
            and frames[-1].filename.endswith(os.path.join("asyncio", "base_events.py")))


_quiet = {"depth": 0, "filter": _QuietOrbax(), "hook": None, "installed": None}
_quiet_lock = threading.Lock()


def _enter_quiet():
    with _quiet_lock:
        if _quiet["depth"] == 0:
            logging.getLogger("absl").addFilter(_quiet["filter"])
            previous = sys.unraisablehook

            def quiet(unraisable):
                if not (_quiet["depth"] and _is_closed_loop_error(unraisable)):
                    previous(unraisable)
            _quiet["hook"], _quiet["installed"] = previous, quiet
            sys.unraisablehook = quiet
        _quiet["depth"] += 1


def _leave_quiet():
    with _quiet_lock:
        _quiet["depth"] -= 1
        if _quiet["depth"] == 0:
            logging.getLogger("absl").removeFilter(_quiet["filter"])
            if sys.unraisablehook is _quiet["installed"]:  # else replaced since: leave it
                sys.unraisablehook = _quiet["hook"]
            _quiet["hook"] = _quiet["installed"] = None


@contextlib.contextmanager
def _quiet_orbax():
    """Within (scopes nest), drop ``_QuietOrbax``'s records and ``_is_closed_loop_error``'s
    errors; when the last scope ends, the logger and the hook are as they were."""
    _enter_quiet()
    try:
        yield
    finally:
        _leave_quiet()


_saving = {}  # id(manager) -> the weakref.finalize that ends the quiet its saves began


def _quiet_until_waited(manager):
    """Be quiet from ``manager``'s save until its saves are waited for or it is gone."""
    if id(manager) not in _saving:
        _enter_quiet()
        _saving[id(manager)] = weakref.finalize(manager, _end_quiet_of_saves, id(manager))


def _end_quiet_of_saves(key):
    if _saving.pop(key, None) is not None:
        _leave_quiet()


def _saves_waited(manager):
    finalizer = _saving.get(id(manager))
    if finalizer is not None:
        finalizer()  # runs _end_quiet_of_saves once


class _Manager(ocp.CheckpointManager):
    """Orbax's CheckpointManager; closing it also ends the quiet of its saves."""

    def close(self) -> None:
        try:
            super().close()
        finally:
            _saves_waited(self)


_STEP_NAMES = ocp.step.standard_name_format()  # a manager's step folders: 8/, 16/, ...


def _steps(directory):
    """{step: folder} of the step folders Orbax finds in ``directory``, finished or not."""
    if not directory.is_dir():
        return {}
    return {found.step: pathlib.Path(found.path) for found in _STEP_NAMES.find_all(directory)}


def _finished(folder):
    """Whether Orbax's step metadata says that the save of ``folder`` was committed."""
    check.regular_files(folder, "delete that step's folder, or restore another step")
    try:
        return ocp.metadata.get_step_metadata(folder).commit_timestamp_nsecs is not None
    except ValueError:  # no step metadata, or not JSON
        return False


def _nearest_existing(path):
    return next(p for p in [path, *path.parents] if p.exists())


_DEEPEST = 160  # characters Orbax adds below the folder: step/item temporaries, shards


def _check_writable(directory):
    """Raise PermissionError unless checkpoints can be written into ``directory`` (or created
    in its nearest existing parent), OSError if its path leaves no room for their files."""
    existing = _nearest_existing(directory)
    if not os.access(existing, os.W_OK | os.X_OK):
        raise NoAccessError(f"cannot write checkpoints into {directory} ({existing} is not "
                            f"writable: no permission, or a read-only disk); pass a folder "
                            f"you can write to")
    limit = os.pathconf(existing, "PC_PATH_MAX")
    if len(str(directory)) + _DEEPEST > limit:
        raise PathError(f"the path of the checkpoint folder is {len(str(directory))} characters "
                        f"long, and its files need about {_DEEPEST} more, past this system's "
                        f"limit of {limit}; pass a shorter path")


def _is_step_being_written(path):
    """Whether ``path`` is the temporary folder of a step being written (or left by a crash)."""
    if not ocp.step.is_path_temporary(path):
        return False
    try:
        ocp.step.step_from_checkpoint_name(path.name)
        return True
    except ValueError:
        return False


def _check_only_checkpoints(directory):
    """Raise FileExistsError naming whatever ``directory`` holds besides finished steps and
    the temporary folders of steps being written: Orbax's clean-up (``max_to_keep``) would
    delete folders it takes for old steps."""
    if not directory.is_dir():
        return
    finished = {folder.name for folder in _steps(directory).values() if _finished(folder)}
    others = sorted(p.name for p in directory.iterdir()
                    if p.name not in finished and not _is_step_being_written(p))
    if others and all((directory / name).is_dir() and not any((directory / name).iterdir())
                      for name in others):
        raise AlreadyExistsError(f"{directory} holds the empty folder(s) {', '.join(others[:5])}"
                                 f", which no save wrote into; delete them (a checkpoint "
                                 f"manager would take them for old steps), or give the "
                                 f"checkpoints a fresh folder")
    if others:
        more = f" and {len(others) - 5} more" if len(others) > 5 else ""
        raise AlreadyExistsError(f"{directory} holds {', '.join(others[:5])}{more}, which are "
                                 f"not checkpoints; a checkpoint manager deletes old numbered "
                                 f"folders, so give the checkpoints a folder of their own (or "
                                 f"move those out)")


def checkpoint_manager(directory: str | os.PathLike, max_to_keep: int | None = 3,
                       create: bool = True, read_only: bool = False,
                       timeout: int | None = None) -> ocp.CheckpointManager:
    """An Orbax CheckpointManager keeping the newest ``max_to_keep`` steps under ``directory``
    (None: all). ``read_only=True``: one that never creates, writes or deletes anything.
    A writing manager refuses a folder it cannot write, or one that holds anything but
    checkpoints (its clean-up would delete numbered folders it did not write). ``timeout``:
    seconds a save may wait for the other processes of a job before it fails (default: Orbax's
    20 minutes). Close it when done, best with ``with checkpoint_manager(...) as manager:``."""
    directory = _check_directory(directory)
    check.integer(1, none=True, max_to_keep=max_to_keep)
    check.integer(1, none=True, timeout=timeout)
    check.flag(create=create, read_only=read_only)
    if read_only:
        options = ocp.CheckpointManagerOptions(read_only=True, create=False, max_to_keep=None,
                                               save_interval_steps=0,
                                               step_name_format=_STEP_NAMES)
    else:
        _check_writable(directory)
        _check_only_checkpoints(directory)
        waits = {} if timeout is None else {"async_options": ocp.AsyncOptions(timeout_secs=timeout)}
        options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=create,
                                               step_name_format=_STEP_NAMES, **waits)
    handlers = {"state": ocp.StandardCheckpointHandler(),  # how each item is written and read
                "data": grain.checkpoint.CheckpointHandler()}
    with _quiet_orbax() if read_only else contextlib.nullcontext():
        return _Manager(directory, options=options, item_handlers=handlers)


def saved_steps(directory: str | os.PathLike) -> list[int]:
    """The finished steps saved under ``directory``, oldest first ([] if there is none): the
    step folders whose Orbax step metadata records a committed save."""
    directory = _check_directory(directory)
    with _quiet_orbax():
        return sorted(step for step, folder in _steps(directory).items() if _finished(folder))


def save_checkpoint(manager: ocp.CheckpointManager, step: int, state: Any,
                    data_iter: grain.DatasetIterator | None = None) -> bool:
    """Save ``state`` (and where the Grain iterator ``data_iter`` is) as ``step``, in the
    background: call ``wait_for_saves(manager)`` before relying on it. A plain iterator as
    ``data_iter`` has no position to save: only the state is saved. A state that holds NaN or
    infinity is refused (a DivergedError naming its arrays), never saved."""
    if not isinstance(manager, ocp.CheckpointManager):
        raise InputError(f"manager must be an Orbax CheckpointManager (d2l.checkpoint_manager), "
                         f"got {type(manager).__name__}")
    check.integer(0, step=step)
    check.tree(state, "state")
    for path, x in jax.tree_util.tree_leaves_with_path(state):
        if not hasattr(x, "dtype") and check._number(x) is None:
            raise InputError(f"state{jax.tree_util.keystr(path)} is {x!r}, not an array or "
                             f"a number; a checkpoint holds arrays")
    held = state.get("step") if isinstance(state, dict) else None
    held = None if held is None else check._values(held)  # as a restore reads it
    if held is not None and held.ndim == 0 and held.dtype.kind in "iu" and int(held) != step:
        raise InputError(f"state['step'] is {int(held)} but it would be saved as step {step}, "
                         f"and a restore checks that they agree; save it as step "
                         f"{int(held)}, or update the state's step first")
    if data_iter is not None and not (hasattr(data_iter, "get_state") or
                                      hasattr(data_iter, "__next__")):
        raise InputError(f"data_iter must be a Grain iterator (with get_state), got "
                         f"{type(data_iter).__name__}; pass iter(loader), or None")
    if not hasattr(data_iter, "get_state"):  # a plain iterator has no position to save
        data_iter = None
    latest = manager.latest_step()
    if latest is not None and step <= latest:
        raise InputError(f"step {step} is not after the latest saved step {latest} in "
                         f"{manager.directory}, and Orbax saves only increasing steps; pass a "
                         f"step > {latest}, or save into a fresh folder")
    check.finite(state, f"the state of step {step}")  # a diverged run is not worth resuming
    _check_room(manager.directory, step, state)
    items = {"state": ocp.args.StandardSave(state)}
    if data_iter is not None:
        items["data"] = grain.checkpoint.CheckpointSave(data_iter)
    _quiet_until_waited(manager)
    if not manager.save(int(step), args=ocp.args.Composite(**items)):
        raise InputError(f"the manager of {manager.directory} did not save step {step}: it is "
                         f"read-only or its save policy skips that step; save with a manager "
                         f"from d2l.checkpoint_manager(directory)")
    return True


def _check_room(directory, step, state):
    need = sum(int(np.prod(np.shape(x))) * np.dtype(getattr(x, "dtype", type(x))).itemsize
               for x in jax.tree.leaves(state))
    free = shutil.disk_usage(_nearest_existing(pathlib.Path(directory))).free
    if free < need:
        raise PathError(f"not enough space to save step {step} into {directory}: the state needs "
                      f"{need:,} bytes, the disk has {free:,} bytes free; free some space, or "
                      f"save into a folder on another disk")


def wait_for_saves(manager: ocp.CheckpointManager) -> None:
    """Wait until ``manager``'s background saves are written. A failed save raises OSError
    naming the folder, the cause and the free space, instead of Orbax's error; the quiet of
    its saves then lasts until the manager is closed, as Orbax's threads may still report
    that failure after the wait."""
    try:
        manager.wait_until_finished()
    except Exception as e:
        directory = pathlib.Path(manager.directory)
        cause = next((x for x in _chain(e) if isinstance(x, OSError) and x.errno), None)
        why = os.strerror(cause.errno) if cause else f"{type(e).__name__}: {str(e)[:300]}"
        free = shutil.disk_usage(_nearest_existing(directory)).free
        raise PathError(f"saving a checkpoint into {directory} failed ({why}); its disk has "
                        f"{free:,} bytes free. Free some space, or pass a shorter path to a "
                        f"folder you can write to") from e
    _saves_waited(manager)


def _by_path(tree):
    """{'params.4': leaf, ...}: the arrays of ``tree`` under the names Orbax gives them."""
    return {jax.tree_util.keystr(path, simple=True, separator="."): x
            for path, x in jax.tree_util.tree_flatten_with_path(tree)[0]}


def _check_fits(saved, target, where):
    saved, target = _by_path(saved), _by_path(target)
    common = sorted(saved.keys() & target.keys())
    shapes = [f"{k}: saved {tuple(saved[k].shape)}, the model has {tuple(target[k].shape)}"
              for k in common if tuple(saved[k].shape) != tuple(target[k].shape)]
    dtypes = [f"{k}: saved {np.dtype(saved[k].dtype)}, the model has {np.dtype(target[k].dtype)}"
              for k in common if getattr(saved[k], "dtype", None) is not None
              and np.dtype(saved[k].dtype) != np.dtype(target[k].dtype)]
    problems = shapes + dtypes
    problems += [f"{k}: saved, but not in the model" for k in saved.keys() - target.keys()]
    problems += [f"{k}: in the model, but not saved" for k in target.keys() - saved.keys()]
    if problems:
        problems.sort(key=lambda p: (not p.startswith("params"), p))  # parameters first
        more = f" and {len(problems) - 3} more" if len(problems) > 3 else ""
        fix = ("Build the model and optimizer as the run that saved it did, or save the new "
               "model's checkpoints in a fresh directory")
        if dtypes and len(dtypes) == len(problems):
            fix = ("Restore into the saved dtypes and cast afterwards (x.astype(...)), or build "
                   "the model with the dtypes it was saved with")
        raise InputError(f"the checkpoint {where} does not fit the model: "
                         f"{'; '.join(problems[:3])}{more}. {fix}")


def _target(target):
    """``target`` with NumPy scalars as 0-d arrays, refusing leaves and layouts Orbax cannot
    restore into."""
    if target is None or not jax.tree.leaves(target):
        raise InputError(f"target holds no arrays ({target!r}); pass the shapes, dtypes and "
                         f"layouts to restore into, e.g. d2l.abstract_like(state, mesh, specs)")
    target = jax.tree.map(lambda x: np.asarray(x) if isinstance(x, np.generic) else x, target)
    for name, x in _by_path(target).items():
        if not isinstance(x, (jax.ShapeDtypeStruct, jax.Array, np.ndarray)):
            raise InputError(f"target {name} is a {type(x).__name__}; give arrays or "
                             f"jax.ShapeDtypeStruct (d2l.abstract_like builds them)")
        sharding = getattr(x, "sharding", None)
        if sharding is None:
            continue
        try:
            if isinstance(sharding, NamedSharding):
                check.spec(sharding.spec, sharding.mesh, x.shape)
            else:
                sharding.shard_shape(x.shape)
        except ValueError as e:
            raise InputError(f"target {name} cannot be laid out as asked: {e}") from None
    return target


def _check_readable(path, recursive=True):
    paths = [str(path)]
    if recursive:
        for root, dirs, files in os.walk(path):
            paths += [os.path.join(root, name) for name in dirs + files]
    for p in paths:
        if not os.access(p, os.R_OK | (os.X_OK if os.path.isdir(p) else 0)):
            raise NoAccessError(f"cannot read {p}: permission denied. Ask for read access to "
                                  f"the checkpoint folder, or copy it somewhere readable")


def _chain(e):
    seen = []
    while e is not None and e not in seen:
        seen.append(e)
        e = e.__cause__ or e.__context__
    return seen


def _status(error):
    """The status code that XLA and TensorStore put first in their errors ('DATA_LOSS: ...')
    and carry no other way, or None."""
    code = str(error).split(":", 1)[0]
    return code if re.fullmatch(r"[A-Z]+(_[A-Z]+)*", code) else None


def _another(steps):
    return (f"Restore another step with step=..., one of {steps}" if steps else
            "No other step is saved: train from scratch, or restore from a copy")


def _damaged(where, why, steps):
    return CheckpointError(f"the checkpoint {where} is damaged: {why}. {_another(steps)}")


def _not_json(error, where):
    """The file under ``where`` (relative to it) that Orbax, TensorStore or Grain failed to
    parse as JSON (``'a metadata file'`` if it cannot be told), or None."""
    for x in _chain(error):
        named = re.search(r'"([^"]+)": Invalid JSON', str(x))  # TensorStore's message
        if named:
            return os.path.relpath(named[1], where)
        if isinstance(x, json.JSONDecodeError):
            size = len(x.doc.encode())
            for f in sorted(where.rglob("*")):
                if f.is_file() and f.stat().st_size == size and \
                        f.read_bytes().decode(errors="replace") == x.doc:
                    return str(f.relative_to(where))
            return "a metadata file"
    return None


def _restore_failure(e, where, steps):
    """The error that says why reading ``where`` failed: no permission, no memory, a metadata
    file that is not JSON, or else a damaged checkpoint."""
    chain = _chain(e)
    codes = {_status(x) for x in chain}
    detail = f"{type(e).__name__}: {str(e)[:200]}"
    if any(isinstance(x, PermissionError) for x in chain) or "PERMISSION_DENIED" in codes:
        return NoAccessError(f"cannot read the checkpoint {where}: permission denied "
                             f"({detail}). Ask for read access to the checkpoint folder, or "
                             f"copy it somewhere readable")
    if any(isinstance(x, MemoryError) for x in chain) or "RESOURCE_EXHAUSTED" in codes:
        return TooLargeError(f"the checkpoint {where} does not fit in the devices' memory "
                             f"({detail}). Restore onto more devices, or split the large "
                             f"arrays over a mesh axis (their PartitionSpecs) so each device "
                             f"holds less")
    not_json = _not_json(e, where)
    if not_json:
        return _damaged(where, f"{not_json} is not valid JSON ({detail})", steps)
    return _damaged(where, f"its arrays cannot be read ({detail})", steps)


def _unfinished(where, steps):
    found = ", ".join(sorted(p.name for p in where.iterdir())) or "nothing"
    return CheckpointError(f"the checkpoint {where} is damaged or unfinished: its Orbax step "
                           f"metadata records no finished save (it holds {found}). "
                           f"{_another(steps)}, or delete the folder")


def _placeable(layout):
    """False if ``layout`` (Orbax's metadata of a saved sharding) names devices not here."""
    try:
        layout.to_jax_sharding()
        return True
    except ValueError:
        return False


def _check_saved_layouts(saved, target, where):
    """Raise ValueError naming the arrays that the target gives no sharding and that were
    saved on devices that are not all here (Orbax would lay them out as they were saved)."""
    saved = _by_path(saved)
    lost = sorted((name for name, x in _by_path(target).items()
                   if isinstance(x, jax.ShapeDtypeStruct) and x.sharding is None
                   and getattr(saved.get(name), "sharding", None) is not None
                   and not _placeable(saved[name].sharding)),
                  key=lambda name: (not name.startswith("params"), name))
    if lost:
        more = f" and {len(lost) - 3} more" if len(lost) > 3 else ""
        raise InputError(f"the arrays of {where} cannot be laid out on these devices: "
                         f"{', '.join(lost[:3])}{more} have no sharding in the target, and "
                         f"the devices they were saved on are not all here. Give every array "
                         f"a sharding on this machine's devices: d2l.abstract_like(shapes, "
                         f"mesh, specs)")


def _check_step(state, step, where, steps):
    """Raise CheckpointError if the state's own step counter says another step than its
    folder's name (a copied or renamed folder)."""
    held = state.get("step") if isinstance(state, dict) else None
    if held is not None and np.ndim(held) == 0 and int(held) != step:
        raise CheckpointError(f"the folder {where} holds the state of step {int(held)}, not of "
                              f"step {step}: it was copied or renamed. Delete it, or name it "
                              f"{int(held)}. {_another(steps)}")


def restore_checkpoint(directory: str | os.PathLike, target: Any, step: int | None = None,
                       data_iter: grain.DatasetIterator | None = None) -> Any:
    """Restore ``step`` (default: the latest finished one) from ``directory`` into arrays laid out
    as ``target`` says (``abstract_like``); move ``data_iter`` to where it was. Reads only.

    Raises FileNotFoundError (no checkpoint), ValueError (a step not saved; arrays of other
    paths, shapes or dtypes; a layout these devices cannot take), PermissionError, MemoryError,
    or CheckpointError (damaged or unfinished); each names the arrays or files and what to do.
    """
    directory = _check_directory(directory)
    target = _target(target)
    check.integer(0, none=True, step=step)
    if data_iter is not None and not hasattr(data_iter, "set_state"):
        raise InputError(f"data_iter must be a Grain iterator (with set_state), got "
                         f"{type(data_iter).__name__}; pass iter(loader), or None")
    if not directory.is_dir():
        raise NotFoundError(f"no checkpoint directory {directory}; pass the directory "
                            f"the run saved its checkpoints into")
    _check_readable(directory, recursive=False)
    with _quiet_orbax():
        return _restore(directory, target, step, data_iter)


def _restore(directory, target, step, data_iter):
    """``restore_checkpoint`` once its arguments are checked."""
    folders = _steps(directory)  # finished or not
    if not folders:
        found = sorted(p.name for p in directory.iterdir()) or "nothing"
        raise NotFoundError(f"{directory} holds no finished checkpoint (it contains "
                            f"{found}); pass the directory the run saved its "
                            f"checkpoints into, or train from scratch")
    steps = sorted(s for s, folder in folders.items() if _finished(folder))
    if step is None:  # the latest finished step, else name the latest unfinished one
        step = steps[-1] if steps else max(folders)
        for later in (s for s in folders if s > step):
            _check_readable(folders[later])  # passed over as unfinished, not as unreadable
    step = int(step)
    if step not in folders:
        raise InputError(f"no checkpoint for step={step!r} in {directory}; it has the "
                         f"steps {steps}")
    where, others = folders[step], [s for s in steps if s != step]
    _check_readable(where)
    if step not in steps:
        raise _unfinished(where, others)
    with checkpoint_manager(directory, read_only=True) as manager:
        try:
            saved = manager.metadata(step).item_metadata.get("state")
        except Exception as e:  # metadata that cannot be read
            raise _restore_failure(e, where, others) from e
        if saved is None:
            raise _damaged(where, "it holds no metadata of the state's arrays", others)
        saved = saved.tree
        _check_fits(saved, target, where)
        _check_saved_layouts(saved, target, where)
        try:
            state = manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(target)))["state"]
        except Exception as e:  # array files missing or unreadable, or no room for them
            raise _restore_failure(e, where, others) from e
        _check_step(state, step, where, others)
        if data_iter is not None:
            try:
                manager.restore(step, args=ocp.args.Composite(
                    data=grain.checkpoint.CheckpointRestore(data_iter)))
            except (KeyError, ValueError) as e:
                if _not_json(e, where):
                    raise _restore_failure(e, where, others) from e
                why = "\n".join(line for line in str(e).splitlines()  # drop Grain's hint on repr
                                if not line.startswith("Grain uses")).rstrip(".")
                raise InputError(f"cannot restore the data iterator from {where}: {why}. Pass "
                                 f"a loader built as the run's was (source, batch size, seed, "
                                 f"shard options, workers), or data_iter=None") from e
            except Exception as e:
                raise _restore_failure(e, where, others) from e
    return state

