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
    _observe,
    _reference_step,
    _run,
    _same_structure,
    _scale,
    _softmax_loss,
    _softmax_problem,
    _tree,
    _update_problem,
)

# --------------------------------------------------------------------------------------------
# 03: data parallelism from scratch


def _split_probe(split_batch, X, y, k):
    """What ``split_batch`` does with a batch: its two arrays, or the exception it raised."""
    if not callable(split_batch):
        _call(split_batch, "split_batch", X, y, k)  # fails, saying why
    try:
        out = split_batch(X, y, k)
    except NotImplementedError:
        _call(split_batch, "split_batch", X, y, k)
    except Exception as e:
        return {"raised": type(e).__name__, "message": _first_line(e),
                "value_error": isinstance(e, ValueError)}
    out = _call(split_batch, "split_batch", X, y, k) if out is None else out
    if not isinstance(out, (tuple, list)) or len(out) != 2:
        return {"returned": type(out).__name__}
    return {"arrays": tuple(np.asarray(a) for a in out)}


@_exercise("03_data_parallel_from_scratch", cases=[("split", 16, 8, (3,)), ("refuse", 20, 8)],
           passed="equal consecutive shards, and a ValueError naming a batch that does not "
                  "divide")
def split_batch(split_batch, case):
    """``split_batch(X, y, num_devices)``: k consecutive equal shards along a new leading axis;
    a ValueError naming the batch size when it does not divide."""
    if case[0] == "split":
        _, n, k, feature = case
        X = np.arange(n * math.prod(feature), dtype=np.float32).reshape(n, *feature)
        y = np.arange(n) % 10
    else:
        _, n, k = case
        X, y = np.zeros((n, 3), np.float32), np.zeros(n, np.int32)
    seen = _observe(lambda: _split_probe(split_batch, X, y, k))
    if case[0] == "split":
        if "raised" in seen:
            _fail(f"`split_batch` raised {seen['raised']}: {seen['message']}")
        if "returned" in seen:
            _fail("return two arrays, (X_shards, y_shards)")
        Xs, ys = seen["arrays"]
        if Xs.shape != (k, n // k, *feature):
            _fail(f"X_shards has shape {Xs.shape} for a batch of {n} on {k} devices: a new "
                  f"leading axis of {k} shards, each {n // k} examples")
        if ys.shape != (k, n // k):
            _fail(f"y_shards has shape {ys.shape}: split the labels like the images")
        if not np.array_equal(Xs.reshape(X.shape), X):
            first = Xs[0].reshape(n // k, -1)[:, 0] // max(1, math.prod(feature))
            _fail(f"shard 0 holds examples {first.astype(int).tolist()}: split the batch into "
                  f"consecutive blocks (examples 0..{n // k - 1} on device 0)")
        if not np.array_equal(ys.reshape(-1), y):
            _fail("the labels no longer match the images: split y exactly like X")
        return
    if "raised" in seen:
        if seen["value_error"] and "reshape" in seen["message"]:
            _fail(f"a batch of {n} on {k} devices fails inside a reshape ({seen['message']}): "
                  f"check the size first and raise a ValueError that names the batch size")
        if not seen["value_error"]:
            _fail(f"a batch of {n} on {k} devices raised {seen['raised']} ({seen['message']}): "
                  f"check the size first and raise a ValueError that names it")
        if str(n) not in seen["message"]:
            _fail(f"your ValueError should name the batch size ({n}) so the reader knows what "
                  f"to change; it says: {seen['message']}")
        return
    if "arrays" in seen:
        kept = int(np.prod(np.shape(seen["arrays"][0])[:2]))
        if kept < n:
            _fail(f"a batch of {n} on {k} devices silently lost {n - kept} examples: the mean "
                  f"gradient would ignore them; raise a ValueError that names the batch size "
                  f"instead")
    _fail(f"a batch of {n} does not split into {k} equal shards, yet your function returned: "
          f"raise a ValueError that names the batch size")


@_exercise("03_data_parallel_from_scratch", cases=[(8, 32, 0.1)],
           passed="equal on every device to one SGD step on the whole batch")
def pmean_step(step, case):
    """``step(params, X, y, loss_fn, lr)``, per device under ``jax.pmap(...,
    axis_name='devices')``: one data-parallel SGD step on the local shard."""
    k, n, lr = case
    params, X, y = _softmax_problem(k + n, n)

    def probe():
        import jax
        replicated = [np.broadcast_to(p, (k, *p.shape)) for p in params]
        program = jax.pmap(lambda p, X, y: _call(step, "step", p, X, y, _softmax_loss, lr),
                           axis_name="devices", devices=_devices(k))
        return _tree(_run(program, replicated, X.reshape(k, n // k, -1), y.reshape(k, -1),
                          name="step"))
    got = _observe(probe)
    want = _reference_step(params, X, y, lr)
    import jax
    _same_structure(jax.tree.map(lambda a: a[0], got), want, "the new parameters")
    got = [np.asarray(a, np.float64) for a in got]
    spread = max(float(np.max(np.abs(a - a[:1]))) for a in got)
    if spread > 1e-5:
        _fail("the devices disagree after one step: each moved by its own shard's gradient. "
              "Average the gradients over 'devices' (lax.pmean) before the update")
    got0 = [a[0] for a in got]
    if not all(_close(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(got0, want)):
        _update_problem(got0, [np.asarray(p, np.float64) for p in params], want, k)


@_exercise("03_data_parallel_from_scratch", cases=[(32, 4, 0.1)],
           passed="one update with the mean gradient of the micro-batches = one data-parallel "
                  "step")
def grad_accumulation(accumulated_step, case):
    """``accumulated_step(params, X, y, loss_fn, lr, num_micro)``, on one device: the gradients
    of ``num_micro`` micro-batches accumulated into one SGD step, equal to one data-parallel
    step on ``num_micro`` devices."""
    n, m, lr = case
    params, X, y = _softmax_problem(n + m, n)
    got = _observe(lambda: _tree(_call(accumulated_step, "accumulated_step", params, X, y,
                                       _softmax_loss, lr, m)))
    want = _reference_step(params, X, y, lr)
    _same_structure(got, want, "the new parameters")
    got = [np.asarray(a, np.float64) for a in got]
    if all(_close(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(got, want)):
        return
    p64 = [np.asarray(p, np.float64) for p in params]
    last = _reference_step(params, X[-(n // m):], y[-(n // m):], lr)
    if m > 1 and all(_close(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(got, last)):
        _fail("only the last micro-batch's gradient counted: add the gradients up across the "
              "micro-batches")
    sequential = params
    for Xm, ym in zip(np.split(X, m), np.split(y, m)):
        sequential = [np.asarray(a, np.float32) for a in _reference_step(sequential, Xm, ym, lr)]
    if m > 1 and all(_close(a, b, rtol=1e-4, atol=1e-5) for a, b in zip(got, sequential)):
        _fail(f"you updated after every micro-batch: that is {m} small SGD steps, not one step "
              f"on the whole batch. Accumulate first, update once")
    r = _scale([a - p for a, p in zip(got, p64)], [a - p for a, p in zip(want, p64)])
    if m > 1 and _near(r, m):
        _fail(f"your update is {m}\u00d7 too large: you summed the {m} micro-batch gradients; "
              f"divide by their number to get the batch's mean gradient (what pmean gives on "
              f"{m} devices)")
    _update_problem(got, p64, want, m)
