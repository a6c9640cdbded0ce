"""Orbax checkpoints of a sharded train state: restores on the same and on another mesh give the
saved arrays in the asked-for layout, a resumed run equals an uninterrupted one, a save cut
short leaves the previous checkpoint usable, and bad input fails clearly without touching files."""
import hashlib
import os
import pathlib
import shutil
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import PartitionSpec as P

import d2l_multi as d2l

BATCH, SAVE_EVERY, CRASH_AT, TOTAL = 32, 4, 10, 12  # checkpoints at 4 and 8; resume from 8


def fingerprint(directory):
    return {str(f.relative_to(directory)): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(pathlib.Path(directory).rglob("*")) if f.is_file()}


def leaves_equal(a, b):
    la, lb = jax.tree.leaves(a), jax.tree.leaves(b)
    return len(la) == len(lb) and all(np.array_equal(x, y) for x, y in zip(la, lb))


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A reference run of TOTAL steps and a run that saves every SAVE_EVERY steps, then crashes."""
    rng = np.random.default_rng(0)
    X = rng.random((4 * BATCH, 28, 28, 1), dtype=np.float32)  # 4 batches per epoch
    y = rng.integers(0, 10, 4 * BATCH).astype(np.int32)
    source = d2l.ArraySource(X, y)
    mesh = d2l.device_mesh((4, 2))
    optimizer = optax.adam(1e-3)
    params = d2l.init_lenet_params(jax.random.key(0))
    specs = d2l.lenet_specs()
    state_0 = d2l.sharded_train_state(params, optimizer, mesh, specs)
    step = d2l.make_train_step(optimizer)
    loader = lambda seed=0: iter(d2l.grain_loader(source, BATCH, seed=seed))
    state_8, ref_a = d2l.train_steps(state_0, step, loader(), mesh, 8)
    ref_it = loader()
    for _ in range(8):
        next(ref_it)
    state_12, ref_b = d2l.train_steps(state_8, step, ref_it, mesh, TOTAL - 8)
    directory = tmp_path_factory.mktemp("ckpt") / "run"
    manager = d2l.checkpoint_manager(directory)
    _, before_crash = d2l.train_steps(state_0, step, loader(), mesh, CRASH_AT, manager,
                                      SAVE_EVERY)
    all_specs = d2l.state_specs(optimizer, params, specs)
    shapes = jax.eval_shape(lambda: d2l.sharded_train_state(params, optimizer, mesh, specs))
    return dict(source=source, mesh=mesh, optimizer=optimizer, params=params, specs=specs,
                all_specs=all_specs, shapes=shapes, step=step, loader=loader, dir=directory,
                state_0=state_0, state_8=state_8, state_12=state_12, reference=ref_a + ref_b,
                before_crash=before_crash, steps_on_disk=manager.all_steps())


def test_state_specs_shard_moments_like_their_parameters(run):
    specs = run["all_specs"]
    assert specs["params"][4] == P(None, "model") and specs["params"][6] == P("model", None)
    adam = specs["opt_state"][0]
    assert adam.mu == run["specs"] and adam.nu == run["specs"]
    assert adam.count == P() and specs["step"] == P()
    W3, mu3 = run["state_0"]["params"][4], run["state_0"]["opt_state"][0].mu[4]
    assert W3.sharding.shard_shape(W3.shape) == (800, 64)
    assert mu3.sharding == W3.sharding


def test_train_steps_saves_every_few_steps(run):
    assert run["steps_on_disk"] == [4, 8]
    assert np.array_equal(run["before_crash"], run["reference"][:CRASH_AT])


def test_restore_on_the_same_mesh_gives_the_saved_arrays_and_layouts(run):
    target = d2l.abstract_like(run["shapes"], run["mesh"], run["all_specs"])
    restored = d2l.restore_checkpoint(run["dir"], target)  # latest: step 8
    assert int(restored["step"]) == 8
    assert leaves_equal(restored, run["state_8"])
    for x, t in zip(jax.tree.leaves(restored), jax.tree.leaves(target)):
        assert x.sharding == t.sharding
    assert int(d2l.restore_checkpoint(run["dir"], target, step=4)["step"]) == 4


@pytest.mark.parametrize("shape", [(2, 4), (8, 1), (1, 1)])
def test_restore_onto_another_mesh_reshards(run, shape):
    devices = d2l.devices(shape[0] * shape[1])
    mesh = d2l.device_mesh(shape, devices=devices)
    restored = d2l.restore_checkpoint(run["dir"], d2l.abstract_like(run["shapes"], mesh,
                                                                     run["all_specs"]))
    assert leaves_equal(restored, run["state_8"])
    W3, nu4 = restored["params"][4], restored["opt_state"][0].nu[6]
    assert W3.sharding.mesh.shape == mesh.shape and W3.sharding.spec == P(None, "model")
    assert W3.sharding.shard_shape(W3.shape) == (800, 128 // shape[1])
    assert {s.data.shape for s in W3.addressable_shards} == {(800, 128 // shape[1])}
    assert nu4.sharding.shard_shape(nu4.shape) == (128 // shape[1], 10)
    assert len(W3.sharding.device_set) == len(devices)


def test_resumed_training_equals_uninterrupted_training(run):
    iterator = run["loader"]()
    restored = d2l.restore_checkpoint(
        run["dir"], d2l.abstract_like(run["shapes"], run["mesh"], run["all_specs"]),
        data_iter=iterator)
    state, losses = d2l.train_steps(restored, run["step"], iterator, run["mesh"], TOTAL - 8)
    assert np.array_equal(losses, run["reference"][8:])  # bit for bit on the same mesh
    assert leaves_equal(state, run["state_12"])


def test_resumed_training_on_another_mesh_agrees_up_to_rounding(run):
    mesh = d2l.device_mesh((2, 4))
    iterator = run["loader"]()
    restored = d2l.restore_checkpoint(
        run["dir"], d2l.abstract_like(run["shapes"], mesh, run["all_specs"]), data_iter=iterator)
    state, losses = d2l.train_steps(restored, run["step"], iterator, mesh, TOTAL - 8)
    np.testing.assert_allclose(losses, run["reference"][8:], rtol=1e-4, atol=1e-5)
    for a, b in zip(jax.tree.leaves(state["params"]), jax.tree.leaves(run["state_12"]["params"])):
        np.testing.assert_allclose(a, b, rtol=1e-3, atol=1e-5)


def test_without_the_iterator_state_the_run_differs(run):
    restored = d2l.restore_checkpoint(
        run["dir"], d2l.abstract_like(run["shapes"], run["mesh"], run["all_specs"]))
    _, losses = d2l.train_steps(restored, run["step"], run["loader"](), run["mesh"], TOTAL - 8)
    assert np.max(np.abs(np.subtract(losses, run["reference"][8:]))) > 1e-3


class PowerCut:
    """A data iterator whose state cannot be saved: the save fails halfway."""

    def get_state(self):
        raise RuntimeError("the power went off")


def test_failed_save_leaves_the_previous_checkpoint_usable(tmp_path):
    mesh = d2l.device_mesh((4, 2))
    state = {"w": d2l.shard(np.arange(64.0).reshape(8, 8), mesh, P(None, "model"))}
    manager = d2l.checkpoint_manager(tmp_path)
    d2l.save_checkpoint(manager, 1, state)
    manager.wait_until_finished()
    with pytest.raises(RuntimeError, match="power went off"):
        d2l.save_checkpoint(manager, 2, {"w": state["w"] + 1}, PowerCut())
        manager.wait_until_finished()
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "1" in names and "2" not in names
    assert any(n.startswith("2.orbax-checkpoint-tmp") for n in names)
    assert d2l.checkpoint_manager(tmp_path).latest_step() == 1
    restored = d2l.restore_checkpoint(tmp_path, d2l.abstract_like(state, mesh,
                                                                  {"w": P(None, "model")}))
    assert np.array_equal(restored["w"], np.arange(64.0).reshape(8, 8))
    d2l.save_checkpoint(manager, 2, {"w": state["w"] + 1})  # the next save replaces the debris
    manager.wait_until_finished()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["1", "2"]


def test_a_job_killed_mid_save_leaves_the_previous_checkpoint_latest(tmp_path):
    job = textwrap.dedent("""
        import pathlib, sys, time
        import numpy as np
        import grain
        import orbax.checkpoint as ocp

        class Stuck:
            def get_state(self):
                pathlib.Path(sys.argv[2]).touch()
                time.sleep(600)

        m = ocp.CheckpointManager(sys.argv[1])
        m.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave({'w': np.full(10, 1.0)})))
        m.wait_until_finished()
        m.save(2, args=ocp.args.Composite(state=ocp.args.StandardSave({'w': np.full(10, 2.0)}),
                                          data=grain.checkpoint.CheckpointSave(Stuck())))
    """)
    directory, signal = tmp_path / "job", tmp_path / "saving"
    proc = subprocess.Popen([sys.executable, "-c", job, str(directory), str(signal)],
                            env=dict(os.environ, JAX_PLATFORMS="cpu"),
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 120
    while not signal.exists() and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    proc.kill()
    stderr = proc.communicate()[1]
    assert signal.exists(), stderr[-2000:]
    assert proc.returncode != 0
    assert d2l.checkpoint_manager(directory, None, create=False).all_steps() == [1]
    assert any(p.name.startswith("2.orbax-checkpoint-tmp") for p in directory.iterdir())
    w = d2l.restore_checkpoint(directory, {"w": np.zeros(10)})["w"]
    assert np.array_equal(w, np.ones(10))


@pytest.fixture()
def bad_inputs(run, tmp_path):
    """Targets and directories that must not restore, and the fingerprint of the good one."""
    small = [p[:, :64] if i == 4 else p[:64] if i in (5, 6) else p
             for i, p in enumerate(run["params"])]
    small_target = d2l.abstract_like(
        jax.eval_shape(lambda: d2l.sharded_train_state(small, run["optimizer"], run["mesh"],
                                                       run["specs"])),
        run["mesh"], d2l.state_specs(run["optimizer"], small, run["specs"]))
    return dict(small=small_target,
                target=d2l.abstract_like(run["shapes"], run["mesh"], run["all_specs"]),
                before=fingerprint(run["dir"]), tmp=tmp_path)


def test_wrong_shapes_name_the_arrays_and_change_nothing(run, bad_inputs):
    with pytest.raises(ValueError) as e:
        d2l.restore_checkpoint(run["dir"], bad_inputs["small"])
    message = str(e.value)
    assert "params.4: saved (800, 128), the model has (800, 64)" in message
    assert str(run["dir"] / "8") in message and "fresh directory" in message
    assert fingerprint(run["dir"]) == bad_inputs["before"]


def test_missing_structure_is_named(run, bad_inputs):
    target = dict(bad_inputs["target"], extra=jax.ShapeDtypeStruct((3,), jnp.float32))
    with pytest.raises(ValueError, match=r"extra: in the model, but not saved"):
        d2l.restore_checkpoint(run["dir"], target)
    target = {k: v for k, v in bad_inputs["target"].items() if k != "step"}
    with pytest.raises(ValueError, match=r"step: saved, but not in the model"):
        d2l.restore_checkpoint(run["dir"], target)
    assert fingerprint(run["dir"]) == bad_inputs["before"]


def test_missing_empty_and_unfinished_directories(bad_inputs):
    tmp, target = bad_inputs["tmp"], bad_inputs["target"]
    with pytest.raises(FileNotFoundError, match=r"no checkpoint directory .*no_such_run"):
        d2l.restore_checkpoint(tmp / "no_such_run", target)
    assert not (tmp / "no_such_run").exists()  # not created either
    (tmp / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"empty holds no finished checkpoint "
                                                r"\(it contains nothing\)"):
        d2l.restore_checkpoint(tmp / "empty", target)
    (tmp / "unfinished" / "3.orbax-checkpoint-tmp").mkdir(parents=True)
    with pytest.raises(FileNotFoundError, match=r"3\.orbax-checkpoint-tmp"):
        d2l.restore_checkpoint(tmp / "unfinished", target)
    assert sorted(p.name for p in (tmp / "unfinished").iterdir()) == ["3.orbax-checkpoint-tmp"]


def test_a_step_that_was_not_saved_lists_the_saved_ones(run, bad_inputs):
    with pytest.raises(ValueError, match=r"step=7 .* has the steps \[4, 8\]"):
        d2l.restore_checkpoint(run["dir"], bad_inputs["target"], step=7)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")  # orbax's loop
@pytest.mark.parametrize("damage", ["metadata", "chunks", "empty step"])
def test_damaged_checkpoints_raise_checkpoint_error_and_are_left_alone(run, bad_inputs, damage):
    copy = bad_inputs["tmp"] / "damaged"
    shutil.copytree(run["dir"], copy)
    step_dir = copy / "8"
    if damage == "metadata":
        f = step_dir / "state" / "_METADATA"
        f.write_bytes(f.read_bytes()[:100])
    elif damage == "chunks":
        for f in (step_dir / "state").rglob("*"):
            if f.is_file() and f.parent.name == "d":
                f.write_bytes(b"not a chunk")
    else:
        shutil.rmtree(step_dir)
        step_dir.mkdir()
    damaged = fingerprint(copy)
    with pytest.raises(d2l.CheckpointError) as e:
        d2l.restore_checkpoint(copy, bad_inputs["target"])
    message = str(e.value)
    assert str(step_dir) in message and "damaged" in message and "[4, 8]" in message
    assert fingerprint(copy) == damaged
    restored = d2l.restore_checkpoint(copy, bad_inputs["target"], step=4)  # the fix works
    assert int(restored["step"]) == 4


def test_a_different_pipeline_cannot_take_the_iterator_state(run, bad_inputs):
    other = iter(d2l.grain_loader(run["source"], BATCH, seed=1))
    with pytest.raises(ValueError) as e:
        d2l.restore_checkpoint(run["dir"], bad_inputs["target"], data_iter=other)
    message = str(e.value)
    assert "seed=0" in message and "seed=1" in message and "data_iter=None" in message
    assert "Grain uses" not in message
    assert fingerprint(run["dir"]) == bad_inputs["before"]


def test_a_checkpoint_without_iterator_says_so(tmp_path, run):
    manager = d2l.checkpoint_manager(tmp_path)
    d2l.save_checkpoint(manager, 1, {"w": np.ones(3)})
    manager.wait_until_finished()
    with pytest.raises(ValueError, match=r"cannot restore the data iterator .*data_iter=None"):
        d2l.restore_checkpoint(tmp_path, {"w": np.zeros(3)}, data_iter=run["loader"]())


def test_abstract_like_checks_specs_against_the_mesh(run):
    with pytest.raises(ValueError, match=r"does not divide evenly"):
        d2l.abstract_like({"w": jax.ShapeDtypeStruct((10, 3), jnp.float32)}, run["mesh"],
                          {"w": P(None, "model")})
    with pytest.raises(ValueError, match=r"mesh has only the axes \('data', 'model'\)"):
        d2l.abstract_like({"w": jax.ShapeDtypeStruct((8,), jnp.float32)}, run["mesh"],
                          {"w": P("batch")})
    target = d2l.abstract_like({"w": np.zeros((8, 4))}, run["mesh"], {"w": P("data")})
    assert target["w"].sharding.spec == P("data") and target["w"].shape == (8, 4)
