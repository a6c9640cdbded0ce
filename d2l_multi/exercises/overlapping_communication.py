"""The checks of the exercises of notebook 09f_overlapping_communication."""
import numpy as np

from ._common import (
    _call,
    _close,
    _exercise,
    _fail,
    _mesh,
    _near,
    _number,
    _observe,
    _run,
    _scale,
    _sub_jaxprs,
)

# --------------------------------------------------------------------------------------------
# 09f: overlapping communication


def _play_buckets(backward, comm, num_buckets):
    """Play the step event by event: the backward pass hands over a bucket every
    ``backward / num_buckets`` seconds; the link all-reduces one bucket at a time, each for
    ``comm / num_buckets`` seconds, in the order they come. Returns when the link is done."""
    link_free = 0.0
    for i in range(num_buckets):                  # the buckets, as the backward pass hands them
        ready = (i + 1) * backward / num_buckets
        start = max(ready, link_free)             # the link takes one when both are there
        link_free = start + comm / num_buckets
    return link_free


@_exercise("09f_overlapping_communication", cases=[(1.0, 0.4, 4), (1.0, 2.0, 4), (0.3, 0.3, 1)],
           passed="the time of the step played bucket by bucket")
def overlapped_step(step_time, case):
    """``step_time(backward, comm, num_buckets)``: seconds until the last gradient is
    all-reduced when the backward pass (``backward`` seconds) produces the gradient in
    ``num_buckets`` equal buckets, each all-reduced (``comm`` / ``num_buckets`` seconds, one at
    a time) as soon as it is ready."""
    t_b, t_c, b = case
    got = _observe(lambda: _number(_call(step_time, "step_time", t_b, t_c, b), "step_time"))
    want = _play_buckets(t_b, t_c, b)
    if _close(got, want, rtol=1e-9):
        return
    if _close(got, max(t_b, t_c)):
        _fail("perfect overlap is impossible: the last bucket's all-reduce can start only when "
              "the backward pass has produced it")
    if _close(got, t_b + t_c):
        _fail("that is no overlap at all: each bucket's all-reduce starts as soon as the "
              "backward pass has produced it")
    if _close(got, t_b + t_c / b):
        _fail(f"for backward={t_b:g} s, comm={t_c:g} s the link is the bottleneck: the "
              f"all-reduces queue up behind each other; when can the first one start?")
    _fail(f"for backward={t_b:g} s, comm={t_c:g} s, {b} buckets you give {got:.4g} s")


# --------------------------------------------------------------------------------------------
# 09f: a bucketed allreduce that starts during the backward pass

_ALLREDUCES = {"psum", "psum2", "psum_invariant"}
_OTHER_COLLECTIVES = {"all_gather", "reduce_scatter", "all_to_all", "ppermute", "pmax", "pmin",
                      "psum_scatter", "all_gather_invariant", "pbroadcast"}
_LOOPS = {"scan", "while", "cond"}


def _tanh_layer(W, x):
    import jax.numpy as jnp
    return jnp.tanh(x @ W)


def _residual_layer(W, x):
    import jax.numpy as jnp
    return x + jnp.tanh(x @ W)


_LAYERS = {"tanh": _tanh_layer, "residual": _residual_layer}


def _names(jaxpr, found):
    for eqn in jaxpr.eqns:
        found.add(eqn.primitive.name)
        for sub in _sub_jaxprs(eqn):
            _names(sub, found)
    return found


def _operations(jaxpr, inputs):
    """The program as the operations it issues, in order: (primitive, input values, output
    values, primitives inside), a value being any hashable token, and the values it
    returns (None: a constant). Calls into other jaxprs (jit, custom_jvp, remat) are
    inlined; loops and conditionals stay one operation."""
    ops = []

    def walk(jaxpr, env):
        def read(atom):
            return env.get(atom) if type(atom).__name__ != "Literal" else None

        for eqn in jaxpr.eqns:
            ins = [read(a) for a in eqn.invars]
            subs = _sub_jaxprs(eqn)
            if (len(subs) == 1 and eqn.primitive.name not in _LOOPS
                    and len(subs[0].invars) == len(ins)
                    and len(subs[0].outvars) == len(eqn.outvars)):
                inner = dict(zip(subs[0].invars, ins))
                walk(subs[0], inner)
                for out, res in zip(eqn.outvars, subs[0].outvars):
                    env[out] = inner.get(res) if type(res).__name__ != "Literal" else None
                continue
            outs = [object() for _ in eqn.outvars]
            env.update(zip(eqn.outvars, outs))
            inside = set()
            for sub in subs:
                _names(sub, inside)
            ops.append((eqn.primitive.name, [v for v in ins if v is not None], outs, inside))

    env = dict(zip(jaxpr.invars, inputs))
    walk(jaxpr, env)
    return ops, [env.get(a) if type(a).__name__ != "Literal" else None
                 for a in jaxpr.outvars]


def _structure(ops, returned, x, y):
    """What the check judges of the program's operations (``returned``: the values it
    returns, one per layer): how many allreduces it issues (arrays reduced by one call
    count once), other collectives, whether loops hide allreduces and, per allreduce in
    the order issued, which returned gradients it feeds (the layers whose returned
    gradient its results reach), and whether the first layer's backward products come
    before it (in the program's order) or among its ancestors. The first layer's backward
    products are the dot_generals of the local input x (untouched by any product) with a
    value computed from the targets y: the gradient of the first layer's weights."""
    producer, y_dependent, x_only = {}, {y}, {x}
    for i, (name, ins, outs, _) in enumerate(ops):
        for v in outs:
            producer[v] = i
        if any(v in y_dependent for v in ins):
            y_dependent.update(outs)
        if ins and name != "dot_general" and name not in _ALLREDUCES and all(
                v in x_only for v in ins):
            x_only.update(outs)
    first_backward = [i for i, (name, ins, _, _) in enumerate(ops) if name == "dot_general"
                      and any(v in x_only for v in ins) and any(v in y_dependent for v in ins)]
    reduces = []  # one allreduce of a list binds one psum per array, one after another
    for i, (name, _, _, _) in enumerate(ops):
        if name in _ALLREDUCES:
            if reduces and reduces[-1][-1] == i - 1:
                reduces[-1].append(i)
            else:
                reduces.append([i])
    hidden = sum(bool(inside & _ALLREDUCES) for name, _, _, inside in ops if name in _LOOPS)
    others = sorted({name for name, _, _, inside in ops
                     for name in {name} | inside if name in _OTHER_COLLECTIVES})
    fed, waits = [], []
    for group in reduces:
        reached = {v for i in group for v in ops[i][2]}
        for _, ins, outs, _ in ops[group[-1] + 1:]:
            if any(v in reached for v in ins):
                reached.update(outs)
        fed.append([n for n, v in enumerate(returned) if v is not None and v in reached])
        ancestors, todo = set(), list(group)
        while todo:
            for v in ops[todo.pop()][1]:
                j = producer.get(v)
                if j is not None and j not in ancestors:
                    ancestors.add(j)
                    todo.append(j)
        waits.append(any(i in ancestors for i in first_backward))
    return {"allreduces": len(reduces), "in_loops": hidden, "others": others,
            "found_first_layer": bool(first_backward), "fed": fed, "waits": waits,
            "after": [bool(first_backward) and min(first_backward) < group[0]
                      for group in reduces]}


def _shard_map_body(jaxpr):
    """The per-device program inside the (first) shard_map of ``jaxpr``."""
    for eqn in jaxpr.eqns:
        for sub in _sub_jaxprs(eqn):
            if eqn.primitive.name == "shard_map":
                return sub
            found = _shard_map_body(sub)
            if found is not None:
                return found
    return None


def _bucket_probe(fn, layer, params, X, Y, num_buckets, k):
    """Run ``fn(layer, params, X, Y, num_buckets)`` per device in shard_map over 'data'
    (params replicated, X and Y split): each device's gradients, and the structure of the
    per-device program the student wrote (its jaxpr)."""
    import jax
    from jax.sharding import PartitionSpec as P
    mesh = _mesh((k,), ("data",))

    def local(params, X, Y):
        grads = _call(fn, "bucketed_grads", _LAYERS[layer], list(params), X, Y, num_buckets)
        if not isinstance(grads, (list, tuple)) or len(grads) != len(params):
            got = (f"{type(grads).__name__} of {len(grads)}" if isinstance(grads, (list, tuple))
                   else f"an array of shape {tuple(grads.shape)}" if hasattr(grads, "shape")
                   else type(grads).__name__)
            _fail(f"`bucketed_grads` should return a list of {len(params)} gradients, one "
                  f"per layer in the order of `params`, got {got}")
        return [jax.numpy.asarray(g)[None] for g in grads]
    program = jax.jit(jax.shard_map(local, mesh=mesh, in_specs=(P(), P("data"), P("data")),
                                    out_specs=P("data"), check_vma=False))
    traced = _run(program.trace, params, X, Y, name="bucketed_grads")
    inner = _shard_map_body(traced.jaxpr.jaxpr)
    tokens = [object() for _ in inner.invars]
    seen = _structure(*_operations(inner, tokens), tokens[-2], tokens[-1])
    out = _run(traced.lower().compile(), params, X, Y, name="bucketed_grads")
    seen["grads"] = [np.asarray(g, np.float64) for g in out]
    return seen


@_exercise("09f_overlapping_communication", cases=[(4, 2, "tanh", 0), (6, 3, "tanh", 1)],
           passed="the global batch's gradients, one allreduce per bucket of consecutive "
                  "layers, last layers first, all but the last sent before the first "
                  "layer's backward pass")
def bucketed_allreduce(bucketed_grads, case):
    """``bucketed_grads(layer, params, X, Y, num_buckets)``, per device in shard_map over
    'data' (8 devices): the list of the L gradients, in the order of ``params``, of the
    mean squared error of the L-layer network ``X -> layer(W_L, ... layer(W_1, X))`` over
    the global batch, with ``num_buckets`` allreduces, each feeding the returned gradients
    of a bucket of consecutive layers (any split): in the order issued, the buckets run
    down from layer L to layer 1, and each but the last is issued before, and needs
    nothing of, the first layer's backward pass."""
    L, num_buckets, layer, seed = case
    k, d, b = 8, 6, 2
    rng = np.random.default_rng(seed)
    params = [(rng.normal(size=(d, d)) / np.sqrt(d)).astype(np.float32) for _ in range(L)]
    X = rng.normal(size=(k * b, d)).astype(np.float32)
    Y = rng.normal(size=(k * b, d)).astype(np.float32)
    seen = _observe(lambda: _bucket_probe(bucketed_grads, layer, params, X, Y, num_buckets, k))
    want = [np.asarray(g, np.float64) for g in _one_device_grads(layer, params, X, Y)]
    got = seen["grads"]
    if [g.shape[1:] for g in got] != [w.shape for w in want]:
        _fail(f"returned gradients of shapes {[g.shape[1:] for g in got]}: return one per "
              f"layer, shaped like its weights ({want[0].shape})")
    if not all(_close(g, g[:1], rtol=1e-6, atol=1e-7) for g in got):
        _fail("the devices' gradients disagree: each device has only its part of the batch; "
              "allreduce (lax.pmean) the gradients over 'data'")
    got = [g[0] for g in got]
    if not all(_close(g, w, rtol=1e-5, atol=1e-6) for g, w in zip(got, want)):
        r = _scale(got, want)
        if _near(r, k):
            _fail(f"your gradients are {k}× too large: lax.psum adds the {k} devices' "
                  f"gradients; their mean (lax.pmean) is the global batch's gradient")
        if _near(r, 1 / k):
            _fail(f"your gradients are {k}× too small: they were averaged twice")
        if all(_close(g, w, rtol=1e-5, atol=1e-6) for g, w in zip(got[::-1], want)):
            _fail("your gradients come last layer first, as the backward pass makes them: "
                  "return them in the order of `params`")
        wrong = [i + 1 for i, (g, w) in enumerate(zip(got, want))
                 if not _close(g, w, rtol=1e-5, atol=1e-6)]
        _fail(f"the gradients of layers {wrong} differ from one device's gradients of the "
              f"global batch: check the backward pass (each layer's vjp takes the gradient "
              f"of its output, from the layer after it)")
    if seen["in_loops"]:
        _fail("your allreduces are inside a lax loop, where the check cannot count them: "
              "write the backward pass as a Python for loop over the layers")
    if seen["others"]:
        _fail(f"your program uses {', '.join(seen['others'])}: allreduce each bucket with "
              f"lax.pmean (one call on the bucket's list of gradients)")
    n = seen["allreduces"]
    if n == 1 and num_buckets > 1:
        _fail(f"one allreduce of all the gradients, at the end (as jax.grad then pmean "
              f"does): it waits for the whole backward pass; issue {num_buckets}, one per "
              f"bucket")
    if n == L and num_buckets < L:
        _fail(f"one allreduce per layer ({L}), not per bucket: group the {L} layers into "
              f"{num_buckets} buckets of consecutive layers, one lax.pmean of a list each")
    if n != num_buckets:
        _fail(f"your program issues {n} allreduces for {num_buckets} buckets: one lax.pmean "
              f"per bucket, on the list of its layers' gradients")
    fed = seen["fed"]
    if not all(fed):
        _fail("one of your allreduces feeds none of the gradients you return: each "
              "lax.pmean should reduce the gradients of a bucket of layers")
    below = L  # the buckets, in the order issued, run down from layer L to layer 1
    for layers in fed:
        if layers != list(range(layers[0], layers[-1] + 1)):
            _fail(f"your allreduce of layers {_span(layers)} reduces layers that are not "
                  f"consecutive: a bucket is consecutive layers, complete as soon as the "
                  f"backward pass reaches its first layer")
        if layers[0] == 0 and below == L and num_buckets > 1:
            _fail(f"your first allreduce, of layers {_span(layers)}, needs the first "
                  f"layer's gradient: buckets in forward order wait for the whole backward "
                  f"pass; allreduce the last layers' bucket first, as soon as the backward "
                  f"pass has produced it")
        if layers[-1] != below - 1:
            _fail(f"your allreduces, in the order you issue them, reduce layers "
                  f"{', '.join(_span(f) for f in fed)}: the backward pass completes the "
                  f"buckets last layers first, each bucket just below the one before; "
                  f"allreduce each as soon as it is complete")
        below = layers[0]
    if num_buckets == 1:
        return
    if not seen["found_first_layer"]:
        _fail("the check finds no product of the input X with a gradient (the first layer's "
              "weight gradient): run the backward pass with jax.vjp of each layer")
    for layers, waits, after in zip(fed[:-1], seen["waits"], seen["after"]):
        if waits:
            _fail(f"your allreduce of layers {_span(layers)} needs the first layer's "
                  f"gradient, so it waits for the whole backward pass: allreduce each bucket "
                  f"as soon as the backward pass has produced it")
        if after:
            _fail(f"your allreduce of layers {_span(layers)} comes after the first layer's "
                  f"backward pass in your program: issue each bucket's allreduce inside the "
                  f"backward loop, as soon as its last gradient exists")


def _span(layers):
    """Layers given by their indices, as the text numbers them: '3-4', '5', '2, 5'."""
    if len(layers) > 1 and layers == list(range(layers[0], layers[-1] + 1)):
        return f"{layers[0] + 1}-{layers[-1] + 1}"
    return ", ".join(str(i + 1) for i in layers)


def _one_device_grads(layer, params, X, Y):
    import jax
    import jax.numpy as jnp

    def loss(params):
        out = X
        for W in params:
            out = _LAYERS[layer](W, out)
        return jnp.mean((out - Y) ** 2)
    return jax.jit(jax.grad(loss))(params)
