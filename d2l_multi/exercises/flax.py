"""The checks of the exercises of notebook 05a_flax."""
import functools

import numpy as np

from ._common import (
    _call,
    _close,
    _equations,
    _exercise,
    _fail,
    _mesh,
    _near,
    _number,
    _observe,
    _run,
    _scale,
    _shown_name,
    _softmax_problem,
)

# --------------------------------------------------------------------------------------------
# 05a: Flax


_MOVES = ("all-gather", "all-to-all", "collective-permute", "reduce-scatter")


def _model_and_optimizer(seed):
    """A small MLP (4 -> 32 -> 3) and its optimizer, SGD with momentum."""
    import optax
    from flax import nnx

    class MLP(nnx.Module):
        def __init__(self, rngs):
            self.hidden = nnx.Linear(4, 32, rngs=rngs)
            self.out = nnx.Linear(32, 3, rngs=rngs)

        def __call__(self, x):
            return self.out(nnx.relu(self.hidden(x)))
    model = MLP(nnx.Rngs(seed))
    return model, nnx.Optimizer(model, optax.sgd(0.1, momentum=0.9), wrt=nnx.Param)


def _params(model):
    import jax
    from flax import nnx
    return [np.asarray(a) for a in jax.tree.leaves(nnx.state(model, nnx.Param))]


def _optimizer_state(optimizer):
    """The optimizer's own state: its momentum and its step count."""
    import jax
    from flax import nnx
    return [np.asarray(a) for a in jax.tree.leaves(nnx.state(optimizer))]


def _mean_loss(model, X, y):
    import optax
    return optax.softmax_cross_entropy_with_integer_labels(model(X), y).mean()


def _largest_product(jaxpr):
    """The most values any matrix product of the program makes at once (a scan's body
    counts once: its iterations run one after another)."""
    return max((int(np.prod(eqn.outvars[0].aval.shape)) for eqn in _equations(jaxpr)
                if eqn.primitive.name == "dot_general"), default=0)


def _reference(seed, X, y, m, mistake=None):
    """The parameters after one step on the whole batch on one device (or after one of the
    plausible wrong steps, to name it)."""
    import jax
    from flax import nnx
    model, optimizer = _model_and_optimizer(seed)
    if mistake is None:
        loss, grads = nnx.value_and_grad(_mean_loss)(model, X, y)
        optimizer.update(model, grads)
        return _params(model), float(loss), _optimizer_state(optimizer)
    for i in range(m):  # an update per micro-batch, of consecutive or interleaved rows
        rows = slice(i * len(X) // m, (i + 1) * len(X) // m) if mistake == "consecutive" \
            else slice(i, None, m)
        optimizer.update(model, jax.tree.map(
            lambda g: g / m, nnx.grad(_mean_loss)(model, X[rows], y[rows])))
    return _params(model), None, None


@_exercise("05a_flax", cases=[(1, 4, 64)],
           passed="m micro-batches, each split over the 8 devices, make one step on the whole "
                  "batch")
def nnx_accumulation(accumulated_step, case):
    """``accumulated_step(model, optimizer, X, y, m)``: one optimizer update, in place, from
    the mean gradient of the m micro-batches of ``X``, taken one after another; returns the
    mean loss. Under ``jax.jit`` with a replicated model and a batch split over 8 devices it
    must equal one step on the whole batch, compute one micro-batch's activations at a time,
    and move no example between devices."""
    seed, m, n = case
    _, X, y = _softmax_problem(50 + seed, n)

    def probe():
        import jax
        from flax import nnx
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P
        mesh = _mesh((8,), ("data",))
        model, optimizer = _model_and_optimizer(seed)
        graphdef, state = nnx.split((model, optimizer))
        state = jax.device_put(state, NamedSharding(mesh, P()))
        batch = jax.device_put((X, y), NamedSharding(mesh, P("data")))

        def step(state, X, y):
            model, optimizer = nnx.merge(graphdef, state)
            loss = _call(written(model, optimizer), "accumulated_step", model, optimizer,
                         X, y, m)
            return loss, nnx.state((model, optimizer))

        def written(model, optimizer):  # a body that ran but returned nothing: say so
            if not callable(accumulated_step):
                return accumulated_step
            before = jax.tree.leaves(nnx.state((model, optimizer)))

            @functools.wraps(accumulated_step)
            def ran(*args):
                out = accumulated_step(*args)
                after = jax.tree.leaves(nnx.state((model, optimizer)))
                if out is None and any(a is not b for a, b in zip(before, after)):
                    name = _shown_name(accumulated_step, "accumulated_step")
                    _fail(f"`{name}` returned None: return the mean loss of the batch")
                return out
            return ran
        traced = _run(jax.jit(step).trace, state, *batch, name="accumulated_step")
        compiled = _run(lambda: traced.lower().compile(), name="accumulated_step")
        loss, state = _run(compiled, state, *batch, name="accumulated_step")
        model, optimizer = nnx.merge(graphdef, state)
        hlo = compiled.as_text()
        return {"params": _params(model), "optimizer": _optimizer_state(optimizer),
                "loss": _number(loss, "accumulated_step"),
                "largest": _largest_product(traced.jaxpr.jaxpr),
                "moves": sorted(op for op in _MOVES if f" {op}(" in hlo
                                or f" {op}-start(" in hlo)}
    seen = _observe(probe)
    before = _params(_model_and_optimizer(seed)[0])
    want, loss, optimized = _reference(seed, X, y, m)
    got = seen["params"]
    if len(got) != len(want) or not all(
            _close(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(got, want)):
        if len(got) == len(want) and any(all(
                _close(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(got, per_micro))
                for per_micro, _, _ in (_reference(seed, X, y, m, order)
                                     for order in ("consecutive", "interleaved"))):
            _fail("you updated after each micro-batch: add up the micro-batches' gradients "
                  "and call optimizer.update once")
        r = _scale([a - b for a, b in zip(got, before)], [a - b for a, b in zip(want, before)])
        if _near(r, m):
            _fail(f"your update is {m}\u00d7 too large: divide the sum of the {m} "
                  f"micro-batches' gradients by {m}")
        if r is not None and abs(r) < 1e-6:
            _fail("the parameters did not change: apply the mean gradient with "
                  "optimizer.update(model, grads)")
        _fail(f"your step differs from one step on the whole batch of {n}: every example "
              f"counts once, with weight 1/{n}")
    got = seen["optimizer"]
    if len(got) != len(optimized) or not all(
            _close(a, b, rtol=1e-4, atol=1e-6) for a, b in zip(got, optimized)):
        _fail("update through `optimizer.update(model, grads)`: your step leaves the "
              "optimizer's state (momentum, step count) as it was")
    micro = n // m * 32  # the hidden layer's activations of one micro-batch
    if seen["largest"] > micro:
        _fail(f"your program computes {seen['largest']} activations at once where one "
              f"micro-batch makes {micro}: run the micro-batches one after another (a loop "
              f"or lax.scan), not the whole batch or a vmap over them")
    if seen["moves"]:
        _fail(f"the compiled step moves examples between devices ({', '.join(seen['moves'])}): "
              f"a micro-batch of consecutive rows lies on a few devices; give micro-batch i "
              f"rows of every device, e.g. X[i::m]")
    if not _close(seen["loss"], loss, rtol=1e-4):
        _fail("the parameters are right but the returned loss is not the whole batch's mean "
              "loss")
