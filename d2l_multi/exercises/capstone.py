"""The checks of the exercises of notebook 12_capstone: a Transformer trained on a 2 x 4
('data', 'model') mesh with FSDP over 'data' and tensor parallelism over 'model'."""
import functools
import math

import numpy as np

from ._common import (
    _call,
    _close,
    _exercise,
    _fail,
    _first_line,
    _mesh,
    _number,
    _observe,
    _plain_rules,
)

# --------------------------------------------------------------------------------------------
# 12: the capstone

_LOGICAL = ("batch", "embed", "heads", "mlp", "vocab")
_TP = ("heads", "mlp", "vocab")  # the logical axes Megatron splits over 'model'
_TOLERANCE = 1e-5  # float32 rounding, as in 02_allreduce
_SMALL = {"vocab_size": 16, "seq_len": 8, "d_model": 32, "num_heads": 8, "num_layers": 1}
_OTHER = {"vocab_size": 24, "seq_len": 12, "d_model": 48, "num_heads": 8, "num_layers": 2}
_LAYOUTS = {  # name: (mesh shape over ('data', 'model'), rules)
    "dp": ((8, 1), {"batch": "data"}),
    "fsdp": ((8, 1), {"batch": "data", "embed": "data"}),
    "tp": ((1, 8), {"heads": "model", "mlp": "model", "vocab": "model"}),
    "dp+tp": ((2, 4), {"batch": "data", "heads": "model", "mlp": "model", "vocab": "model"}),
    "fsdp+tp": ((2, 4), {"batch": "data", "embed": "data",
                         "heads": "model", "mlp": "model", "vocab": "model"}),
}


def _rules_of(layout):
    shape, rules = _LAYOUTS[layout]
    return shape, {axis: rules.get(axis) for axis in _LOGICAL}


def _axes(value):
    if isinstance(value, (tuple, list)):
        return {v for v in value if v is not None}
    return {value} if value is not None else set()


def _model_fn(config, seed=0):
    from flax import nnx

    from d2l_multi.transformer import TransformerLM
    return lambda: TransformerLM(**config, rngs=nnx.Rngs(seed))


def _tokens(config, batch, seed, steps=1):
    rng = np.random.default_rng(seed)
    shape = (steps, batch, config["seq_len"])
    X = rng.integers(0, config["vocab_size"], size=shape).astype(np.int32)
    return [(X[i], np.roll(X[i], -1, axis=1)) for i in range(steps)]


def _logical_names(config):
    """{parameter path: logical names} of the model, read from its abstract state."""
    import jax
    from flax import nnx
    with nnx.use_eager_sharding(False):
        state = nnx.state(nnx.eval_shape(_model_fn(config)))
    leaves = jax.tree_util.tree_leaves_with_path(
        state, is_leaf=lambda x: isinstance(x, nnx.Variable))
    return {_key(p): tuple(v.get_metadata().get("out_sharding") or ()) for p, v in leaves}


def _key(path):
    import jax
    return jax.tree_util.keystr(path).removesuffix(".value")


def _clash(rules, config):
    """A parameter whose dimensions name one mesh axis twice under ``rules``, or None."""
    for path, names in _logical_names(config).items():
        used = [a for n in names if n is not None for a in _axes(rules.get(n))]
        if len(used) != len(set(used)):
            return path, names
    return None


def _flat(tree):
    import jax
    return {_key(p): x for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def _one_device_model(config):
    from flax import nnx
    with nnx.use_eager_sharding(False):  # the names lay nothing out yet
        return _model_fn(config)()


def _laid_out(config, mesh, rules):
    """The model laid out on ``mesh`` by ``rules`` (the values ``model_fn()`` gives)."""
    from d2l_multi.strategies import reshard
    return reshard(_one_device_model(config), mesh, rules)


@functools.cache
def _one_device_losses(config, seed, steps, optimizer):
    """Losses and parameters of ``steps`` plain steps (``optimizer``: 'sgd' at 0.5 or 'adam'
    at 1e-3) on one device, on ``_tokens(dict(config), 8, seed, steps)``: what a layout must
    give. Computed where the check judges (when grading, the grader's process, which never
    runs the student's code), so an answer cannot change it."""
    import optax
    from flax import nnx

    from d2l_multi.strategies import lm_train_step
    config = dict(config)
    model = _one_device_model(config)
    tx = optax.sgd(0.5) if optimizer == "sgd" else optax.adam(1e-3)
    opt = nnx.Optimizer(model, tx, wrt=nnx.Param)
    losses = [float(lm_train_step(model, opt, X, Y))
              for X, Y in _tokens(config, 8, seed, steps)]
    return losses, {k: np.asarray(v) for k, v in _flat(nnx.state(model, nnx.Param)).items()}


def _max_diff(got, want):
    """The largest difference between two dicts of arrays; -1 when their keys or shapes
    differ."""
    if not isinstance(got, dict) or sorted(got) != sorted(want) or any(
            np.shape(got[k]) != want[k].shape for k in want):
        return -1.0
    return max(float(np.max(np.abs(np.asarray(got[k]) - want[k]))) for k in want)


# ----- part 1: the rules ---------------------------------------------------------------------

@_exercise("12_capstone", cases=[("2x4", 0)],
           passed="every matrix split over both axes; one step equals one device's")
def rules_2d(rules, case):
    """``rules``: logical axis -> mesh axis for ``TransformerLM`` on a 2 x 4 ('data', 'model')
    mesh, FSDP over 'data' and Megatron tensor parallelism over 'model'."""
    _, seed = case
    config = _SMALL if seed == 0 else _OTHER

    def probe():
        import optax
        from flax import nnx

        from d2l_multi.sharding import use_sharding
        from d2l_multi.strategies import lm_train_step, shard_tokens
        plain = _plain_rules(rules)
        missing = [a for a in _LOGICAL if a not in plain]
        if missing or not all(_axes(v) <= {"data", "model"} for v in plain.values()):
            return {"rules": plain}
        clash = _clash(plain, config)
        if clash:
            return {"rules": plain, "clash": clash}
        mesh = _mesh((2, 4), ("data", "model"))
        model = _laid_out(config, mesh, plain)
        names = _logical_names(config)
        held = {k: (tuple(x.shape), tuple(x.addressable_shards[0].data.shape),
                    sum(n is not None for n in names[k]))
                for k, x in _flat(nnx.state(model, nnx.Param)).items()}
        (X, Y), = _tokens(config, 8, seed)
        with use_sharding(mesh, plain):
            opt = nnx.Optimizer(model, optax.sgd(0.5), wrt=nnx.Param)
            loss = float(lm_train_step(model, opt, *shard_tokens(X, Y, mesh, plain)))
        got = {k: np.asarray(v) for k, v in _flat(nnx.state(model, nnx.Param)).items()}
        return {"rules": plain, "held": held, "loss": loss, "params": got}
    seen = _observe(probe)
    plain = seen["rules"]
    missing = [a for a in _LOGICAL if a not in plain]
    if missing:
        _fail(f"name every logical axis, None meaning replicated: missing {missing}")
    for a, v in plain.items():
        if not _axes(v) <= {"data", "model"}:
            _fail(f"'{a}' maps to {v!r}: the mesh's axes are 'data' and 'model' (or None)")
    if _axes(plain["batch"]) != {"data"}:
        _fail("FSDP is data parallelism with sharded states: map 'batch' to 'data' (and only "
              "to 'data': tensor parallelism computes every example on all 4 devices of a row)")
    if "clash" in seen:
        path, names = seen["clash"]
        _fail(f"the parameter {path} has the logical axes {names}, and your rules send two of "
              f"them to one mesh axis: each mesh axis may split one dimension of an array")
    embed, tp = _axes(plain["embed"]), {a: _axes(plain[a]) for a in _TP}
    if embed == {"model"} and all(v <= {"data"} for v in tp.values()):
        _fail("the axes are swapped: FSDP goes over 'data' (map 'embed' to it), tensor "
              "parallelism over 'model' ('heads', 'mlp', 'vocab')")
    if embed == {"data", "model"}:
        _fail("'embed' over both axes is FSDP over all 8 devices, with no tensor "
              "parallelism: map 'embed' to 'data' and the axes Megatron splits to 'model'")
    if not embed:
        _fail("each matrix is split only over 'model' (1/4 per device): FSDP over 'data' "
              "also splits the dimension tensor parallelism leaves whole, 'embed'")
    short = [a for a, v in tp.items() if v != {"model"}]
    if short:
        _fail(f"{short} not over 'model': Megatron splits 'heads', 'mlp' and 'vocab' over "
              f"'model' (with {short} whole some matrices are split only over 'data')")
    if embed != {"data"}:
        _fail("map 'embed' to 'data': FSDP splits the dimension that tensor parallelism "
              "leaves whole")
    for path, (shape, shard, named) in seen["held"].items():
        if named >= 2 and math.prod(shape) != 8 * math.prod(shard):
            _fail(f"{path} {shape}: device 0 holds {shard}, not 1/8 of it")
    (want,), want_params = _one_device_losses(tuple(config.items()), seed, 1, "sgd")
    loss, diff = seen["loss"], _max_diff(seen["params"], want_params)
    if abs(loss - want) > _TOLERANCE or not 0 <= diff <= _TOLERANCE:
        _fail(f"one step with your rules differs from one device's (loss {loss:.6f} vs "
              f"{want:.6f}, parameters by up to {diff:.1e})")


# ----- part 2: memory predicted ----------------------------------------------------------------

def _measure(config, layout, compiled):
    """Bytes device 0 holds of the parameters and of Adam's two moments under ``layout``
    (from the shardings of the abstract state; with ``compiled``, of the arrays laid out and
    of the compiled step's arguments, less its batch), and of the replicated arrays."""
    import jax
    import optax
    from flax import nnx

    from d2l_multi.sharding import use_sharding
    from d2l_multi.strategies import lm_train_step, shard_tokens
    shape, rules = _rules_of(layout)
    mesh = _mesh(shape, ("data", "model"))
    adam = optax.adam(1e-3)

    def states(model, opt):
        return nnx.state(model, nnx.Param), nnx.state(opt, nnx.OptState)
    with nnx.use_eager_sharding(False):
        model, opt = nnx.eval_shape(lambda: (lambda m: (m, nnx.Optimizer(
            m, adam, wrt=nnx.Param)))(_model_fn(config)()))
    params, moments = states(model, opt)
    with use_sharding(mesh, rules):
        shardings = nnx.get_named_sharding((params, moments), mesh)

    def held(tree, sharding):
        return sum(math.prod(s.shard_shape(x.shape)) * x.dtype.itemsize
                   for x, s in zip(jax.tree.leaves(tree), jax.tree.leaves(sharding)) if x.ndim)
    names = _logical_names(config)
    out = {"params": held(params, shardings[0]), "moments": held(moments, shardings[1]),
           "replicated": sum(math.prod(x.shape) * x.dtype.itemsize
                             for k, x in _flat(params).items() if not any(names[k])),
           "total": sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(params))}
    if compiled:
        device = jax.devices()[0]

        def on_device(tree):
            return sum(s.data.nbytes for x in jax.tree.leaves(tree) if x.ndim
                       for s in x.addressable_shards if s.device == device)
        model = _laid_out(config, mesh, rules)
        (X, Y), = _tokens(config, 8, 0)
        with use_sharding(mesh, rules):
            opt = nnx.Optimizer(model, adam, wrt=nnx.Param)
            batch = shard_tokens(X, Y, mesh, rules)
            stats = lm_train_step.lower(model, opt, *batch).compile().memory_analysis()
        out["measured"] = tuple(on_device(t) for t in states(model, opt))
        if stats is not None:
            out["arguments"] = stats.argument_size_in_bytes - on_device(batch)
    return out


@_exercise("12_capstone", cases=[("small", ("dp", "fsdp", "tp", "fsdp+tp"))],
           passed="the bytes device 0 holds, exactly, for each layout")
def memory_prediction(predict_bytes, case):
    """``predict_bytes(config, mesh_shape, rules)``: the bytes of parameters, gradients and
    Adam's two moments (float32) device 0 holds for ``TransformerLM(**config)`` on a
    ('data', 'model') mesh of ``mesh_shape`` laid out by ``rules``."""
    which, layouts = case
    config = _SMALL if which == "small" else _OTHER

    def probe():
        seen = {}
        for layout in layouts:
            shape, rules = _rules_of(layout)
            got = _number(_call(predict_bytes, "predict_bytes", dict(config), shape,
                                dict(rules)), "predict_bytes")
            seen[layout] = {"got": got, **_measure(config, layout, layout == "fsdp+tp")}
        return seen
    seen = _observe(probe)
    for layout in layouts:
        s = seen[layout]
        got, params, moments = s["got"], s["params"], s["moments"]
        want = 2 * params + moments  # the gradients are laid out as the parameters
        if s.get("measured", (params, moments)) != (params, moments):
            _fail(f"{layout}: the arrays laid out hold {s['measured']} bytes, not the "
                  f"{(params, moments)} their shardings say")  # a bug of the check's own
        if got == want:
            if "arguments" in s and abs(s["arguments"] - (want - params)) > 0.01 * want:
                _fail(f"{layout}: the compiled step's arguments hold {s['arguments']} bytes "
                      f"of states, not the {want - params} your prediction implies")
            continue
        rep, total = s["replicated"], s["total"]
        if _close(got, 2 * params):
            _fail(f"{layout}: you left out Adam's two moments (mu and nu, each laid out as "
                  f"the parameters)")
        if _close(got, 3 * params):
            _fail(f"{layout}: Adam keeps two moments, mu and nu, each as large as the "
                  f"parameters")
        if _close(got, params):
            _fail(f"{layout}: count the gradients and Adam's two moments too, four arrays "
                  f"per parameter")
        if _close(got, 4 * total / 8):
            _fail(f"{layout}: you divided everything by the 8 devices; an array splits only "
                  f"over the mesh axes its rules name (the LayerNorms over none)")
        if _close(got, want - 4 * rep) or _close(got, want - 4 * rep + 4 * rep / 8):
            _fail(f"{layout}: the LayerNorms' scales and biases have no logical names, so "
                  f"every device holds them whole")
        _fail(f"{layout}: predicted {got:.0f} bytes, device 0 holds {want} "
              f"({got / want:.3g}\u00d7)")


# ----- part 3: the step proven equal -------------------------------------------------------

_STEPS = 3


def _train(train, config, rules, batches):
    """Run the student's ``train`` on the 2 x 4 mesh: losses, parameters, collective kinds."""
    import jax

    from d2l_multi.hlo import collective_ops
    mesh = _mesh((2, 4), ("data", "model"))
    out = _call(train, "train", _model_fn(config), mesh, dict(rules), batches)
    if not isinstance(out, (tuple, list)) or len(out) != 3:
        _fail("`train` should return (losses, params, hlo_text)")
    losses, params, hlo = out
    if not isinstance(hlo, str) or "HloModule" not in hlo:
        _fail("the third result should be the compiled step's HLO text: "
              "step.lower(...).compile().as_text()")
    try:
        losses = [float(x) for x in losses]
        params = {k: np.asarray(jax.device_get(v)) for k, v in _flat(params).items()}
    except (TypeError, ValueError) as e:
        _fail(f"`train` returned losses or params that are not arrays: {_first_line(e)}")
    kinds = sorted({op.kind for op in collective_ops(hlo)})
    return losses, params, kinds


def _kinds(config, rules, batch):
    """The kinds of collective of the plain step compiled for ``rules`` on the 2 x 4 mesh."""
    import optax
    from flax import nnx

    from d2l_multi.hlo import collective_ops
    from d2l_multi.sharding import use_sharding
    from d2l_multi.strategies import lm_train_step, shard_tokens
    mesh = _mesh((2, 4), ("data", "model"))
    model = _laid_out(config, mesh, rules)
    with use_sharding(mesh, rules):
        opt = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
        step = lm_train_step.lower(model, opt, *shard_tokens(*batch, mesh, rules))
        return sorted({op.kind for op in collective_ops(step.compile().as_text())})


@_exercise("12_capstone", cases=[0],
           passed="same losses and parameters as one device; the collectives foreseen")
def sharded_training(train, uses_all_gather, case):
    """``train(model_fn, mesh, rules, batches)`` -> ``(losses, params, hlo_text)``: Adam
    (optax.adam(1e-3)) steps of ``model_fn()`` laid out on ``mesh`` by ``rules``, one per
    batch, run with the 2-D rules (FSDP over 'data', tensor parallelism over 'model');
    ``uses_all_gather(rules)``: whether the compiled step all-gathers."""
    def probe():
        plain = _rules_of("fsdp+tp")[1]
        batches = _tokens(_SMALL, 8, case, _STEPS)
        losses, params, kinds = _train(train, _SMALL, plain, batches)
        dp_tp = _rules_of("dp+tp")[1]
        dp_tp_kinds = _kinds(_SMALL, dp_tp, batches[0])
        predicted = [bool(_call(uses_all_gather, "uses_all_gather", dict(r)))
                     for r in (plain, dp_tp)]
        return {"losses": losses, "params": params, "predicted": predicted,
                "kinds": (kinds, dp_tp_kinds)}
    seen = _observe(probe)
    losses = seen["losses"]
    want, want_params = _one_device_losses(tuple(_SMALL.items()), case, _STEPS, "adam")
    if len(losses) != len(want):
        _fail(f"{len(losses)} losses for {len(want)} batches: one step, and one loss, per "
              f"batch")
    if losses and all(_close(x, want[0], rtol=_TOLERANCE) for x in losses) and len(want) > 1:
        _fail("every step has the first step's loss: carry the model and the optimizer from "
              "one step to the next")
    if not _close(losses[0], want[0], rtol=_TOLERANCE):
        _fail(f"the first loss is {losses[0]:.6f}, one device's {want[0]:.6f}: start from "
              f"model_fn()'s parameters and lay the batch out as the rules say")
    if not _close(losses, want, rtol=_TOLERANCE):
        _fail(f"the first loss matches but later ones differ ({losses} vs one device's "
              f"{[round(x, 6) for x in want]}): the optimizer should be optax.adam(1e-3), "
              f"updating every parameter each step")
    diff = _max_diff(seen["params"], want_params)
    if diff < 0:
        _fail("return the parameters as nnx.state(model, nnx.Param)")
    if diff > 10 * _TOLERANCE:
        _fail(f"the parameters differ from one device's by up to {diff:.1e}")
    (kinds, dp_tp_kinds), predicted = seen["kinds"], seen["predicted"]
    if "all-reduce" not in kinds:
        _fail("your step has no all-reduce: lay the model and the batch out with the rules "
              "`train` is given")
    for name, has, guess in (("fsdp+tp", "all-gather" in kinds, predicted[0]),
                             ("dp+tp", "all-gather" in dp_tp_kinds, predicted[1])):
        if has and not guess:
            _fail(f"{name}: the compiled step all-gathers (FSDP gathers each weight split "
                  f"over 'data' before using it), but you predicted it would not")
        if guess and not has:
            _fail(f"{name}: no all-gather in the compiled step: Megatron's tensor parallelism "
                  f"allreduces partial sums; only a split 'embed' (FSDP) needs gathers")
