"""The checks of the exercises of notebook 10a_checkpoints."""
import numpy as np

from ._common import _call, _close, _exercise, _fail, _mesh, _observe, _run

# --------------------------------------------------------------------------------------------
# 10a: checkpoints

_SAVED_SPECS = [(None, "model"), ("model",), ("model", None), ()]  # as LeNet's dense layers
_SAVED_MESH = {"data": 2, "model": 4}
_AXES = ("data", "model")


def _mlp_problem(seed):
    """A small MLP's parameters (one array no mesh axis splits) and 5 batches of 16."""
    rng = np.random.default_rng(seed)
    params = [rng.normal(size=(6, 16)).astype(np.float32) / 3,
              np.zeros(16, np.float32),
              rng.normal(size=(16, 3)).astype(np.float32) / 4,
              np.zeros(3, np.float32)]
    batches = [(rng.normal(size=(16, 6)).astype(np.float32),
                rng.integers(0, 3, size=16).astype(np.int32)) for _ in range(5)]
    return params, batches


def _mlp_loss(params, X, y):
    import jax
    import jax.numpy as jnp
    W1, b1, W2, b2 = params
    logp = jax.nn.log_softmax(jnp.tanh(X @ W1 + b1) @ W2 + b2)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=1))


def _adam_step():
    import jax
    import optax
    optimizer = optax.adam(0.05)

    def step(state, X, y):
        loss, grads = jax.value_and_grad(_mlp_loss)(state["params"], X, y)
        updates, opt_state = optimizer.update(grads, state["opt_state"], state["params"])
        return {"params": optax.apply_updates(state["params"], updates),
                "opt_state": opt_state, "step": state["step"] + 1}, loss
    return optimizer, step


def _losses(state, step, batches, shardings=None):
    import jax
    run = jax.jit(step) if shardings is None else jax.jit(step,
                                                           out_shardings=(shardings, None))
    losses = []
    for X, y in batches:
        state, loss = run(state, X, y)
        losses.append(float(loss))
    return state, losses


def _layout(x, struct, mesh, k):
    """How ``struct`` (a leaf of the student's target) lays out the saved array ``x``."""
    import jax
    from jax.sharding import NamedSharding
    if isinstance(struct, jax.Array):
        return {"kind": "array"}
    if not isinstance(struct, jax.ShapeDtypeStruct):
        return {"kind": type(struct).__name__}
    if tuple(struct.shape) != x.shape or struct.dtype != x.dtype:
        return {"kind": "struct", "shape": list(struct.shape), "dtype": str(struct.dtype)}
    sharding = struct.sharding
    if not isinstance(sharding, NamedSharding):
        return {"kind": "struct", "sharding": None if sharding is None else "other"}
    spec, sizes = tuple(sharding.spec), dict(sharding.mesh.shape)
    seen = {"kind": "struct", "devices": int(sharding.mesh.devices.size),
            "mesh": {str(n): int(v) for n, v in sharding.mesh.shape.items()},
            "on_mesh": dict(sharding.mesh.shape) == dict(mesh.shape) and bool(
                np.all(sharding.mesh.devices == mesh.devices))}
    for axis, names in enumerate(spec):
        ways = int(np.prod([sizes[n] for n in ((names,) if isinstance(names, str) else
                                              names or ())]))
        if x.shape[axis] % ways:
            return dict(seen, uneven=axis, ways=ways)
    return dict(seen, block=int(np.prod(sharding.shard_shape(x.shape))), size=int(x.size),
                splittable=any(n % k == 0 for n in x.shape))


@_exercise("10a_checkpoints", cases=[((8, 1), 0)],
           passed="restored split over 'data', the run goes on as if never interrupted")
def fsdp_restore(fsdp_target, case):
    """``fsdp_target(shapes, mesh)``: the restore target of a train state saved on a 2 x 4
    mesh, laid out over ``mesh`` so that every array with an axis that 'data' divides is
    split over 'data' (at most 1/k of it per device). The check judges the target's layout
    (a ShapeDtypeStruct on ``mesh`` per array, of the saved shape and dtype), then lays the
    saved state out as the target says (``jax.device_put``) and trains on: the losses must
    repeat the uninterrupted run's."""
    mesh_shape, seed = case
    params, batches = _mlp_problem(seed)
    k = mesh_shape[0]

    def probe():
        import jax
        import jax.numpy as jnp
        import optax
        from jax.sharding import NamedSharding
        from jax.sharding import PartitionSpec as P
        optimizer, step = _adam_step()
        saved_mesh = _mesh(tuple(_SAVED_MESH.values()), _AXES)
        state = {"params": params, "opt_state": optimizer.init(params),
                 "step": jnp.zeros((), jnp.int32)}
        specs = [P(*s) for s in _SAVED_SPECS]
        specs = {"params": specs, "step": P(), "opt_state": optax.tree_map_params(
            optimizer, lambda _, s: s, jax.eval_shape(optimizer.init, params), specs,
            transform_non_params=lambda _: P())}
        state = jax.tree.map(lambda x, s: jax.device_put(x, NamedSharding(saved_mesh, s)),
                             state, specs)
        state, _ = _losses(state, step, batches[:2])  # trained, then saved
        shapes = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype,
                                                             sharding=x.sharding), state)
        mesh = _mesh(mesh_shape, _AXES)
        target = _call(fsdp_target, "fsdp_target", shapes, mesh)
        paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(state)]
        if jax.tree.structure(target) != jax.tree.structure(state):
            return {"structure": False}
        leaves = [_layout(np.asarray(x), t, mesh, k) for x, t in
                  zip(jax.tree.leaves(state), jax.tree.leaves(target))]
        seen = {"structure": True, "paths": paths, "leaves": leaves}
        if any("block" not in leaf for leaf in leaves):
            return seen
        shardings = jax.tree.map(lambda t: t.sharding, target)
        restored = _run(jax.device_put, state, shardings, name="fsdp_target")
        _, losses = _run(_losses, restored, step, batches[2:], shardings, name="fsdp_target")
        return dict(seen, losses=losses)
    seen = _observe(probe)
    if not seen["structure"]:
        _fail("the target should have the structure of the saved state (params, opt_state, "
              "step)")
    for path, leaf in zip(seen["paths"], seen["leaves"]):
        if leaf["kind"] == "array":
            _fail("you returned arrays: a target only describes each array "
                  "(jax.ShapeDtypeStruct: shape, dtype, sharding); allocating them first costs "
                  "the memory twice")
        if leaf["kind"] != "struct":
            _fail(f"{path} is a {leaf['kind']}: describe it with jax.ShapeDtypeStruct(shape, "
                  f"dtype, sharding=...)")
        if "shape" in leaf:
            _fail(f"{path} is {leaf['dtype']}{leaf['shape']} in your target: keep the saved "
                  f"shape and dtype")
        if "sharding" in leaf:
            _fail(f"{path} has no NamedSharding: give it NamedSharding(mesh, spec) on the new "
                  f"mesh")
        if not leaf["on_mesh"]:
            saved = " (the mesh it was saved from?)" if leaf["mesh"] == _SAVED_MESH else ""
            _fail(f"{path} is laid out on a mesh {leaf['mesh']} of {leaf['devices']} devices, "
                  f"not on the one you restore onto, {dict(zip(_AXES, mesh_shape))}{saved}: "
                  f"build its sharding on `mesh`")
        if "uneven" in leaf:
            _fail(f"{path}'s axis {leaf['uneven']} does not divide into {leaf['ways']} blocks: "
                  f"split an axis that the mesh axis divides, or replicate the array")
    for path, leaf in zip(seen["paths"], seen["leaves"]):
        if leaf["splittable"] and leaf["block"] * k > leaf["size"]:
            _fail(f"each device holds {leaf['block']} of the {leaf['size']} values of "
                  f"{path}: split an axis of it that {k} divides over 'data' (the 'model' "
                  f"axis of this mesh splits little or nothing)")
    _, want = _losses_one_device(params, batches)
    if not _close(seen["losses"], want[2:], rtol=1e-5, atol=1e-6):
        _fail("training on from the saved state laid out as your target says differs from "
              "the uninterrupted run: give every array its saved shape and dtype")


def _losses_one_device(params, batches):
    import jax.numpy as jnp
    optimizer, step = _adam_step()
    state = {"params": params, "opt_state": optimizer.init(params),
             "step": jnp.zeros((), jnp.int32)}
    return _losses(state, step, batches)
