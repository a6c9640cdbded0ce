"""The checks of the exercises of notebook 03_data_parallel_from_scratch."""
import math

import numpy as np

from ._common import (
    _call,
    _close,
    _devices,
    _exercise,
    _fail,
    _first_line,
    _near,
    _reference_step,
    _run,
    _same_structure,
    _scale,
    _softmax_loss,
    _softmax_problem,
    _update_problem,
)

# --------------------------------------------------------------------------------------------
# 03: data parallelism from scratch

@_exercise("03_data_parallel_from_scratch")
def split_batch(split_batch, hidden=False):
    """``split_batch(X, y, num_devices)``: k consecutive equal shards along a new leading axis;
    a ValueError naming the batch size when it does not divide."""
    cases = [(16, 8, (3,))] + ([(12, 4, (2, 2)), (6, 1, ())] if hidden else [])
    for n, k, feature in cases:
        X = np.arange(n * math.prod(feature), dtype=np.float32).reshape(n, *feature)
        y = np.arange(n) % 10
        out = _call(split_batch, "split_batch", X, y, k)
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            _fail("return two arrays, (X_shards, y_shards)")
        Xs, ys = (np.asarray(a) for a in out)
        if Xs.shape != (k, n // k, *feature):
            _fail(f"X_shards has shape {Xs.shape} for a batch of {n} on {k} devices: a new "
                  f"leading axis of {k} shards, each {n // k} examples")
        if ys.shape != (k, n // k):
            _fail(f"y_shards has shape {ys.shape}: split the labels like the images")
        if not np.array_equal(Xs.reshape(X.shape), X):
            first = Xs[0].reshape(n // k, -1)[:, 0] // max(1, math.prod(feature))
            _fail(f"shard 0 holds examples {first.astype(int).tolist()}: split the batch "
                  f"into consecutive blocks (examples 0..{n // k - 1} on device 0)")
        if not np.array_equal(ys.reshape(-1), y):
            _fail("the labels no longer match the images: split y exactly like X")
    for n, k in [(20, 8)] + ([(10, 4), (7, 2)] if hidden else []):
        X, y = np.zeros((n, 3), np.float32), np.zeros(n, np.int32)
        try:
            out = split_batch(X, y, k)
        except ValueError as e:
            if "reshape" in str(e):
                _fail(f"a batch of {n} on {k} devices fails inside a reshape "
                      f"({_first_line(e)}): check the size first and raise a ValueError that "
                      f"names the batch size")
            if str(n) not in str(e):
                _fail(f"your ValueError should name the batch size ({n}) so the reader knows "
                      f"what to change; it says: {_first_line(e)}")
            continue
        except NotImplementedError:
            _call(split_batch, "split_batch", X, y, k)
        except Exception as e:
            _fail(f"a batch of {n} on {k} devices raised {type(e).__name__} ({_first_line(e)}):"
                  f" check the size first and raise a ValueError that names it")
        try:
            kept = int(np.prod(np.shape(out[0])[:2]))
        except Exception:
            kept = None
        if kept is not None and kept < n:
            _fail(f"a batch of {n} on {k} devices silently lost {n - kept} examples: the "
                  f"mean gradient would ignore them; raise a ValueError that names the batch "
                  f"size instead")
        _fail(f"a batch of {n} does not split into {k} equal shards, yet your function "
              f"returned: raise a ValueError that names the batch size")
    return "equal consecutive shards, and a ValueError naming a batch that does not divide"


@_exercise("03_data_parallel_from_scratch")
def pmean_step(step, hidden=False):
    """``step(params, X, y, loss_fn, lr)``, per device under ``jax.pmap(...,
    axis_name='devices')``: one data-parallel SGD step on the local shard."""
    import jax
    for k, n, lr in [(8, 32, 0.1)] + ([(4, 12, 0.5)] if hidden else []):
        params, X, y = _softmax_problem(k + n, n)
        want = _reference_step(params, X, y, lr)
        replicated = [np.broadcast_to(p, (k, *p.shape)) for p in params]
        program = jax.pmap(lambda p, X, y: _call(step, "step", p, X, y, _softmax_loss, lr),
                           axis_name="devices", devices=_devices(k))
        got = _run(program, replicated, X.reshape(k, n // k, -1), y.reshape(k, -1),
                   name="step")
        _same_structure(jax.tree.map(lambda a: a[0], got), want, "the new parameters")
        got = [np.asarray(a, np.float64) for a in got]
        spread = max(float(np.max(np.abs(a - a[:1]))) for a in got)
        if spread > 1e-5:
            _fail("the devices disagree after one step: each moved by its own shard's "
                  "gradient. Average the gradients over 'devices' (lax.pmean) before the update")
        got0 = [a[0] for a in got]
        if not all(_close(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(got0, want)):
            _update_problem(got0, [np.asarray(p, np.float64) for p in params], want, k)
    return "equal on every device to one SGD step on the whole batch"


@_exercise("03_data_parallel_from_scratch")
def grad_accumulation(accumulated_step, hidden=False):
    """``accumulated_step(params, X, y, loss_fn, lr, num_micro)``, on one device: the gradients
    of ``num_micro`` micro-batches accumulated into one SGD step, equal to one data-parallel
    step on ``num_micro`` devices."""
    for n, m, lr in [(32, 4, 0.1)] + ([(24, 3, 0.3), (8, 1, 0.1)] if hidden else []):
        params, X, y = _softmax_problem(n + m, n)
        want = _reference_step(params, X, y, lr)
        got = _call(accumulated_step, "accumulated_step", params, X, y, _softmax_loss, lr, m)
        _same_structure(got, want, "the new parameters")
        got = [np.asarray(a, np.float64) for a in got]
        if all(_close(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(got, want)):
            continue
        p64 = [np.asarray(p, np.float64) for p in params]
        last = _reference_step(params, X[-(n // m):], y[-(n // m):], lr)
        if m > 1 and all(_close(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(got, last)):
            _fail("only the last micro-batch's gradient counted: add the gradients up across "
                  "the micro-batches")
        sequential = params
        for Xm, ym in zip(np.split(X, m), np.split(y, m)):
            sequential = [np.asarray(a, np.float32)
                          for a in _reference_step(sequential, Xm, ym, lr)]
        if m > 1 and all(_close(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(got, sequential)):
            _fail(f"you updated after every micro-batch: that is {m} small SGD steps, not one "
                  f"step on the whole batch. Accumulate first, update once")
        r = _scale([a - p for a, p in zip(got, p64)], [a - p for a, p in zip(want, p64)])
        if m > 1 and _near(r, m):
            _fail(f"your update is {m}\u00d7 too large: you summed the {m} micro-batch "
                  f"gradients; divide by their number to get the batch's mean gradient (what "
                  f"pmean gives on {m} devices)")
        _update_problem(got, p64, want, m)
    return "one update with the mean gradient of the micro-batches = one data-parallel step"
