"""The training loop of notebooks 10a and 10b: steps on a mesh that save the train state (and
the input pipeline's position) every few steps, so that a run can stop and resume.

The shown function carries no argument checks; its public name checks first
(``check.validated``), so bad input gets a message naming the fix. A state that holds NaN or
infinity is never saved (``save_checkpoint`` refuses it)."""
from typing import Any

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from . import _checks as check
from ._earlier import resume as d2l
from .errors import InputError


def train_steps(state, train_step, batches, mesh, num_steps, manager=None,
                save_every=0):
    """Take ``num_steps`` steps on ``batches`` (an iterator), saving every
    ``save_every`` steps with ``manager``; return the state and the losses."""
    start, losses = int(state["step"]), []
    for step in range(start + 1, start + num_steps + 1):
        X, y = next(batches)
        X, y = jax.device_put((X, y), NamedSharding(mesh, P("data")))
        params, opt_state, loss = train_step(state["params"],
                                             state["opt_state"], X, y)
        state = {"params": params, "opt_state": opt_state,
                 "step": state["step"] + 1}
        losses.append(loss)  # an array: the loop does not wait for it
        if save_every and step % save_every == 0:  # in the background
            d2l.save_checkpoint(manager, step, state, batches)
    if manager is not None:
        d2l.wait_for_saves(manager)  # every save written
    return state, [float(loss) for loss in losses]


def _check_train_steps(state: Any, train_step: Any, batches: Any, mesh: Any,
                       num_steps: int, manager: Any = None, save_every: int = 0) -> None:
    """Refuse a bad mesh, count, step function or iterator, and saves without a manager."""
    check.mesh(mesh)
    check.integer(0, num_steps=num_steps)
    check.integer(0, save_every=save_every)
    if not callable(train_step) or not hasattr(batches, "__next__"):
        raise InputError("train_step must be a function (d2l.make_train_step) and batches an "
                         "iterator: pass iter(loader), not the loader")
    if save_every and manager is None:
        raise InputError(f"save_every={save_every} needs a manager to save with; pass "
                         f"manager=d2l.checkpoint_manager(directory), or save_every=0")
    if "data" not in mesh.axis_names:
        raise InputError(f"mesh must have an axis 'data' to split the batches over, got the "
                         f"axes {mesh.axis_names}")


train_steps = check.validated(train_steps, _check_train_steps)
