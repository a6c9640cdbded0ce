"""Orbax checkpoints of a sharded train state: restores on the same and on another mesh give the
saved arrays in the asked-for layout, a resumed run equals an uninterrupted one, a save cut
short leaves the previous checkpoint usable, and bad input fails clearly without touching files:
every failure of a restore says what it is (damaged, mismatched, layout, memory, permission),
keeps its cause, changes no file and leaves no checkpoint manager open."""
import asyncio
import contextlib
import hashlib
import logging
import os
import pathlib
import re
import shutil
import subprocess
import sys
import textwrap
import time
import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import orbax.checkpoint as ocp
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

import d2l_multi as d2l
from d2l_multi import _checks as check
from d2l_multi.checkpoint import wait_for_saves

BATCH, SAVE_EVERY, CRASH_AT, TOTAL = 32, 4, 10, 12  # checkpoints at 4 and 8; resume from 8


def fingerprint(directory):
    """Every path under ``directory`` (itself included) with its modification time, and the
    sha256 of every file."""
    root = pathlib.Path(directory)
    return {str(f.relative_to(root)): (f.stat().st_mtime_ns, f.is_file() and
                                       hashlib.sha256(f.read_bytes()).hexdigest())
            for f in [root, *sorted(root.rglob("*"))]}


@contextlib.contextmanager
def read_only(folder):
    """``folder`` made unwritable for this process: a read-only mount for root (whom file
    permissions do not stop), the permissions for anyone else."""
    if os.geteuid() != 0:
        folder.chmod(0o555)
        try:
            yield
        finally:
            folder.chmod(0o755)
        return
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(folder)],
                      capture_output=True).returncode:
        pytest.skip("root without a read-only mount: cannot make a folder unwritable")
    try:
        yield
    finally:
        subprocess.run(["umount", str(folder)], check=True)


@pytest.fixture()
def open_managers(monkeypatch):
    """The Orbax CheckpointManagers created during a test and not closed yet."""
    opened, init, close = [], ocp.CheckpointManager.__init__, ocp.CheckpointManager.close

    def tracked_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        opened.append(self)

    def tracked_close(self):
        if self in opened:
            opened.remove(self)
        close(self)
    monkeypatch.setattr(ocp.CheckpointManager, "__init__", tracked_init)
    monkeypatch.setattr(ocp.CheckpointManager, "close", tracked_close)
    return opened


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
    with d2l.checkpoint_manager(directory) as manager:
        _, before_crash = d2l.train_steps(state_0, step, loader(), mesh, CRASH_AT, manager,
                                          SAVE_EVERY)
    all_specs = d2l.state_specs(optimizer, params, specs)
    shapes = jax.eval_shape(lambda: d2l.sharded_train_state(params, optimizer, mesh, specs))
    return dict(source=source, mesh=mesh, optimizer=optimizer, params=params, specs=specs,
                all_specs=all_specs, shapes=shapes, step=step, loader=loader, dir=directory,
                state_0=state_0, state_8=state_8, state_12=state_12, reference=ref_a + ref_b,
                before_crash=before_crash, steps_on_disk=d2l.saved_steps(directory))


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
    with d2l.checkpoint_manager(tmp_path) as manager:
        d2l.save_checkpoint(manager, 1, state)
        manager.wait_until_finished()
        with pytest.raises(RuntimeError, match="power went off"):
            d2l.save_checkpoint(manager, 2, {"w": state["w"] + 1}, PowerCut())
            manager.wait_until_finished()
        names = sorted(p.name for p in tmp_path.iterdir())
        assert "1" in names and "2" not in names
        assert any(n.startswith("2.orbax-checkpoint-tmp") for n in names)
        assert d2l.saved_steps(tmp_path) == [1]
        restored = d2l.restore_checkpoint(tmp_path, d2l.abstract_like(state, mesh,
                                                                      {"w": P(None, "model")}))
        assert np.array_equal(restored["w"], np.arange(64.0).reshape(8, 8))
        d2l.save_checkpoint(manager, 2, {"w": state["w"] + 1})  # replaces the debris
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
    assert d2l.saved_steps(directory) == [1]
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


# Orbax 0.12.8 closes its event loop as soon as one chunk fails to read; TensorStore then
# completes the other reads and their callbacks find the loop closed (no manager is left open:
# the test checks that).
@pytest.mark.filterwarnings(r"ignore:Exception ignored in. None[\s\S]*Event loop is closed"
                            r":pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("damage,named", [
    ("metadata", "state/_METADATA is not valid JSON"),
    ("sharding metadata", "state/_sharding is not valid JSON"),
    ("iterator state", "is not valid JSON"),
    ("chunks", "cannot be read"),
    ("empty step", "damaged or unfinished: its Orbax step metadata records no finished save"),
])
def test_damaged_checkpoints_raise_checkpoint_error_and_are_left_alone(run, bad_inputs, damage,
                                                                       named, open_managers):
    """Each damaged file is diagnosed as damage (not as a layout or a pipeline problem): the
    message names the step's folder and what is wrong, and advises the other step. A damaged
    file does not make a finished step unfinished: the latest restore raises (an emptied step
    is no finished one, so it is asked for by number)."""
    copy = bad_inputs["tmp"] / "damaged"
    shutil.copytree(run["dir"], copy)
    step_dir = copy / "8"
    if damage in ("metadata", "sharding metadata"):
        f = step_dir / "state" / ("_METADATA" if damage == "metadata" else "_sharding")
        f.write_bytes(f.read_bytes()[:100])
    elif damage == "iterator state":
        for f in (step_dir / "data").rglob("*.json"):
            f.write_text(f.read_text()[:20])
    elif damage == "chunks":
        for f in (step_dir / "state").rglob("*"):
            if f.is_file() and f.parent.name == "d":
                f.write_bytes(b"not a chunk")
    else:
        shutil.rmtree(step_dir)
        step_dir.mkdir()
    damaged = fingerprint(copy)
    step = 8 if damage == "empty step" else None
    with pytest.raises(d2l.CheckpointError) as e:
        d2l.restore_checkpoint(copy, bad_inputs["target"], step, data_iter=run["loader"]())
    message = str(e.value)
    assert str(step_dir) in message and "damaged" in message and named in message, message
    assert "Restore another step with step=..., one of [4]" in message, message
    assert fingerprint(copy) == damaged
    assert open_managers == []
    restored = d2l.restore_checkpoint(copy, bad_inputs["target"], step=4)  # the fix works
    assert int(restored["step"]) == 4


def test_a_missing_step_lists_the_saved_ones(run, bad_inputs):
    copy = bad_inputs["tmp"] / "missing"
    shutil.copytree(run["dir"], copy)
    shutil.rmtree(copy / "8")
    with pytest.raises(ValueError, match=r"no checkpoint for step=8 .* it has the steps \[4\]"):
        d2l.restore_checkpoint(copy, bad_inputs["target"], step=8)
    assert int(d2l.restore_checkpoint(copy, bad_inputs["target"])["step"]) == 4


def test_a_numbered_folder_that_is_no_checkpoint_is_not_a_step(run, bad_inputs):
    """An empty 100/ is not step 100: it is not listed, the latest restore passes it over, and
    asking for it names it."""
    copy = bad_inputs["tmp"] / "stray"
    shutil.copytree(run["dir"], copy)
    (copy / "100").mkdir()
    assert d2l.saved_steps(copy) == [4, 8]
    assert int(d2l.restore_checkpoint(copy, bad_inputs["target"])["step"]) == 8
    with pytest.raises(d2l.CheckpointError, match=r"100 is damaged or unfinished: .*it holds "
                                                  r"nothing.*one of \[4, 8\]"):
        d2l.restore_checkpoint(copy, bad_inputs["target"], step=100)


def test_the_default_restore_is_the_latest_finished_step(tmp_path):
    """A later step folder that holds no finished save (an empty 2/) is passed over: the
    default restore is step 1, and asking for step 2 says it is unfinished."""
    with d2l.checkpoint_manager(tmp_path) as manager:
        d2l.save_checkpoint(manager, 1, {"w": np.ones(3), "step": np.asarray(1, np.int32)})
    (tmp_path / "2").mkdir()
    target = {"w": np.zeros(3), "step": np.asarray(0, np.int32)}
    assert d2l.saved_steps(tmp_path) == [1]
    restored = d2l.restore_checkpoint(tmp_path, target)
    assert int(restored["step"]) == 1 and np.array_equal(restored["w"], np.ones(3))
    with pytest.raises(d2l.CheckpointError, match=r"2 is damaged or unfinished.*one of \[1\]"):
        d2l.restore_checkpoint(tmp_path, target, step=2)


def test_a_copied_step_folder_is_refused(run, bad_inputs):
    """A folder 12/ holding the state of step 4 (a copy) would resume from the wrong step."""
    copy = bad_inputs["tmp"] / "copied"
    shutil.copytree(run["dir"], copy)
    shutil.copytree(copy / "4", copy / "12")
    with pytest.raises(d2l.CheckpointError, match=r"12 holds the state of step 4, not of step "
                                                  r"12: it was copied or renamed"):
        d2l.restore_checkpoint(copy, bad_inputs["target"])


def test_arrays_saved_on_devices_this_machine_lacks_need_a_layout(run, bad_inputs):
    """A checkpoint written on other devices (its _sharding names device ids 100..107),
    restored into targets without a sharding: the advice is to give every array one."""
    copy = bad_inputs["tmp"] / "elsewhere"
    shutil.copytree(run["dir"], copy)
    f = copy / "8" / "state" / "_sharding"
    f.write_text(re.sub(r'(\\"id\\": )(\d+)', lambda m: f"{m[1]}{100 + int(m[2])}",
                        f.read_text()))
    assert '\\"id\\": 100' in f.read_text()
    unplaced = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype),
                            bad_inputs["target"])
    with pytest.raises(ValueError, match=r"params\.0, params\.1, params\.2 and \d+ more have "
                                         r"no sharding in the target, and the devices they "
                                         r"were saved on are not all here.*Give every array a "
                                         r"sharding"):
        d2l.restore_checkpoint(copy, unplaced)
    restored = d2l.restore_checkpoint(copy, bad_inputs["target"])  # the fix works
    assert leaves_equal(restored, run["state_8"])


def test_a_manager_refuses_a_folder_holding_anything_but_its_checkpoints(tmp_path):
    """Orbax's clean-up (max_to_keep) would delete numbered folders it takes for old steps."""
    for name in ("2023", "2024"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "photo.jpg").write_bytes(b"mine")
    before = fingerprint(tmp_path)
    with pytest.raises(FileExistsError, match=r"holds 2023, 2024, which are not checkpoints"):
        with d2l.checkpoint_manager(tmp_path, max_to_keep=1) as manager:
            for step in (1, 2, 3):
                d2l.save_checkpoint(manager, step, {"w": np.ones(2)})
            manager.wait_until_finished()
    assert fingerprint(tmp_path) == before
    assert d2l.saved_steps(tmp_path) == []  # reading is harmless


def test_an_empty_step_folder_is_named_as_such(tmp_path):
    (tmp_path / "8").mkdir()
    with pytest.raises(FileExistsError, match=r"holds the empty folder\(s\) 8, which no save "
                                              r"wrote into; delete them"):
        d2l.checkpoint_manager(tmp_path)


def test_a_manager_refuses_a_folder_it_cannot_write(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    with read_only(locked):
        with pytest.raises(PermissionError, match=rf"cannot write checkpoints into {locked}"):
            d2l.checkpoint_manager(locked)
        with pytest.raises(PermissionError, match=rf"cannot write checkpoints into {locked}"):
            d2l.checkpoint_manager(locked / "run")


def test_a_save_that_does_not_fit_on_the_disk_is_refused_before_writing(tmp_path,
                                                                        monkeypatch):
    from d2l_multi import checkpoint
    usage = shutil.disk_usage(tmp_path)
    monkeypatch.setattr(checkpoint.shutil, "disk_usage",
                        lambda path: usage._replace(free=1000))
    with d2l.checkpoint_manager(tmp_path) as manager:
        with pytest.raises(OSError, match=r"not enough space to save step 1 into .*: the state "
                                          r"needs 8,000 bytes, the disk has 1,000 bytes "
                                          r"free"):
            d2l.save_checkpoint(manager, 1, {"w": np.ones(1000)})
    assert list(tmp_path.iterdir()) == []


def test_a_different_pipeline_cannot_take_the_iterator_state(run, bad_inputs):
    other = iter(d2l.grain_loader(run["source"], BATCH, seed=1))
    with pytest.raises(ValueError) as e:
        d2l.restore_checkpoint(run["dir"], bad_inputs["target"], data_iter=other)
    message = str(e.value)
    assert "seed=0" in message and "seed=1" in message and "data_iter=None" in message
    assert "Grain uses" not in message
    assert fingerprint(run["dir"]) == bad_inputs["before"]


def test_a_checkpoint_without_iterator_says_so(tmp_path, run):
    with d2l.checkpoint_manager(tmp_path) as manager:
        d2l.save_checkpoint(manager, 1, {"w": np.ones(3)})
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


def test_a_dtype_mismatch_is_refused_not_cast(run, bad_inputs):
    """Restoring float32 arrays into a bfloat16 model would silently round them: refused."""
    target = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, jnp.bfloat16, sharding=x.sharding)
                          if x.dtype == jnp.float32 else x, bad_inputs["target"])
    with pytest.raises(ValueError) as e:
        d2l.restore_checkpoint(run["dir"], target)
    message = str(e.value)
    assert "params.0: saved float32, the model has bfloat16" in message
    assert "more" in message and "cast afterwards" in message
    assert fingerprint(run["dir"]) == bad_inputs["before"]


def test_a_layout_the_devices_cannot_take_is_named(run, bad_inputs):
    mesh3 = d2l.device_mesh((3,), ("model",), devices=d2l.devices(3))
    target = dict(bad_inputs["target"])
    W3 = target["params"][4]
    target["params"] = [*target["params"][:4],
                        jax.ShapeDtypeStruct(W3.shape, W3.dtype,
                                             sharding=NamedSharding(mesh3, P(None, "model"))),
                        *target["params"][5:]]
    with pytest.raises(ValueError, match=r"target params\.4 cannot be laid out as asked: .*size "
                                         r"128 does not divide evenly over 3 devices"):
        d2l.restore_checkpoint(run["dir"], target)
    assert fingerprint(run["dir"]) == bad_inputs["before"]


@pytest.mark.parametrize("failure,kind,message", [
    (PermissionError(13, "Permission denied", "x/_METADATA"), PermissionError,
     "permission denied"),
    (MemoryError(), MemoryError, "does not fit in the devices' memory"),
    (jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate "
                                "512.00MiB."), MemoryError, "does not fit in the devices' memory"),
    (OSError("DATA_LOSS: Error reading chunk"), d2l.CheckpointError, "is damaged"),
    (ValueError("sharding of a kind never seen"), d2l.CheckpointError, "is damaged"),
])
def test_restore_failures_say_what_they_are(run, bad_inputs, open_managers, monkeypatch,
                                            failure, kind, message):
    """Whatever the reader reports is named for what it is, with the cause kept."""
    def fail(self, *args, **kwargs):
        raise failure
    monkeypatch.setattr(ocp.CheckpointManager, "restore", fail)
    with pytest.raises(kind, match=message) as e:
        d2l.restore_checkpoint(run["dir"], bad_inputs["target"])
    assert e.value.__cause__ is failure
    assert str(run["dir"] / "8") in str(e.value)
    assert open_managers == []
    assert fingerprint(run["dir"]) == bad_inputs["before"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads files whatever their permissions")
def test_an_unreadable_checkpoint_is_a_permission_error(run, bad_inputs):
    copy = bad_inputs["tmp"] / "locked"
    shutil.copytree(run["dir"], copy)
    # a file of the state, then the step folder (its step metadata unreadable too: not passed
    # over as unfinished)
    for locked, mode in [(copy / "8" / "state" / "_METADATA", 0o644), (copy / "8", 0o755)]:
        locked.chmod(0)
        try:
            with pytest.raises(PermissionError,
                               match=rf"cannot read {locked}: permission denied"):
                d2l.restore_checkpoint(copy, bad_inputs["target"])
        finally:
            locked.chmod(mode)


def test_every_restore_closes_its_manager(run, bad_inputs, open_managers):
    d2l.restore_checkpoint(run["dir"], bad_inputs["target"])
    for attempt in [lambda: d2l.restore_checkpoint(run["dir"], bad_inputs["small"]),
                    lambda: d2l.restore_checkpoint(run["dir"], bad_inputs["target"], step=7),
                    lambda: d2l.restore_checkpoint(bad_inputs["tmp"], bad_inputs["target"])]:
        with pytest.raises((ValueError, FileNotFoundError)):
            attempt()
    assert d2l.saved_steps(run["dir"]) == [4, 8]
    assert open_managers == []


def test_importing_the_module_installs_no_hooks():
    """A fresh process: importing d2l_multi.checkpoint (after the libraries it uses) leaves
    sys.unraisablehook and the filters of the root and absl loggers as they were."""
    job = textwrap.dedent("""
        import logging, sys
        import absl.logging, grain, jax, optax, orbax.checkpoint
        hooks = lambda: (sys.unraisablehook, logging.getLogger().filters[:],
                         logging.getLogger("absl").filters[:])
        before = hooks()
        import d2l_multi.checkpoint
        print("unchanged" if hooks() == before else f"changed: {before} -> {hooks()}")
    """)
    result = subprocess.run([sys.executable, "-c", job], capture_output=True, text=True,
                            env=dict(os.environ, JAX_PLATFORMS="cpu"), timeout=300)
    assert result.stdout.strip() == "unchanged", result.stdout + result.stderr[-2000:]


def closed_loop_error():
    """What sys.unraisablehook gets from a TensorStore callback that finds the event loop
    closed."""
    loop = asyncio.new_event_loop()
    loop.close()
    try:
        loop.call_soon_threadsafe(print)
    except RuntimeError as e:
        return types.SimpleNamespace(exc_type=RuntimeError, exc_value=e, err_msg=None,
                                     exc_traceback=e.__traceback__, object=None)


def test_orbax_s_noise_is_dropped_during_the_calls_only(run, bad_inputs, monkeypatch, caplog):
    """Orbax's warning that a read-only manager is read-only, and the errors of callbacks that
    find Orbax's event loop closed, are dropped while a restore runs; afterwards the absl
    logger and sys.unraisablehook are as they were, and the same messages get through."""
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    absl, hook = logging.getLogger("absl"), sys.unraisablehook
    filters = absl.filters[:]
    other = types.SimpleNamespace(exc_value=ValueError("not Orbax's"), exc_traceback=None)

    def fail(self, *args, **kwargs):
        sys.unraisablehook(closed_loop_error())
        sys.unraisablehook(other)
        raise OSError("DATA_LOSS: Error reading chunk")
    monkeypatch.setattr(ocp.CheckpointManager, "restore", fail)
    with caplog.at_level(logging.WARNING):
        with pytest.raises(d2l.CheckpointError, match="cannot be read"):
            d2l.restore_checkpoint(run["dir"], bad_inputs["target"])
        d2l.checkpoint_manager(run["dir"], read_only=True).close()
        assert unraisable == [other]  # the closed loop's error was dropped
        assert "read only" not in caplog.text
        assert absl.filters == filters and sys.unraisablehook is hook
        ocp.CheckpointManager(run["dir"], options=ocp.CheckpointManagerOptions(
            read_only=True, create=False)).close()
        assert "Given directory is read only" in caplog.text  # not dropped outside the calls
    sys.unraisablehook(closed_loop_error())
    assert len(unraisable) == 2


def test_a_save_is_quiet_until_waited_for(tmp_path, monkeypatch):
    """From a save to wait_for_saves (or the manager's close) the closed loop's errors are
    dropped; then the hooks are as they were."""
    unraisable = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    absl, hook = logging.getLogger("absl"), sys.unraisablehook
    filters = absl.filters[:]
    for i, wait in enumerate([wait_for_saves, lambda manager: manager.close()]):
        with d2l.checkpoint_manager(tmp_path / str(i)) as manager:
            d2l.save_checkpoint(manager, 1, {"w": np.ones(3)})
            d2l.save_checkpoint(manager, 2, {"w": np.ones(3)})
            sys.unraisablehook(closed_loop_error())
            assert unraisable == [] and absl.filters != filters
            wait(manager)
            assert absl.filters == filters and sys.unraisablehook is hook
        sys.unraisablehook(closed_loop_error())
        assert len(unraisable) == 1
        unraisable.clear()


def test_a_failed_background_save_is_one_error_without_orbax_s_traceback(tmp_path):
    """Files may not grow past 100 kB, as on a full disk: the save fails in Orbax's background
    thread, which logs a traceback; wait_for_saves raises one OSError and nothing else is
    printed, not even what TensorStore reports on Orbax's closed event loop after the wait."""
    job = textwrap.dedent("""
        import asyncio, logging, sys, types
        import numpy as np
        import d2l_multi as d2l
        from d2l_multi.checkpoint import wait_for_saves

        def late_report():  # a TensorStore callback finding Orbax's event loop closed
            loop = asyncio.new_event_loop()
            loop.close()
            try:
                loop.call_soon_threadsafe(print)
            except RuntimeError as e:
                sys.unraisablehook(types.SimpleNamespace(
                    exc_type=RuntimeError, exc_value=e, exc_traceback=e.__traceback__,
                    err_msg=None, object=None))
        hooks = lambda: (sys.unraisablehook, logging.getLogger("absl").filters[:])
        before = hooks()
        with d2l.checkpoint_manager(sys.argv[1]) as manager:
            d2l.save_checkpoint(manager, 1, {"w": np.random.default_rng(0).random(10**5)})
            try:
                wait_for_saves(manager)
            except OSError as e:
                print(f"{type(e).__name__}: {e}")
                late_report()
        print("hooks restored:", hooks() == before)
    """)
    small_files = ["sh", "-c", 'trap "" XFSZ; ulimit -f 200; exec "$@"', "sh"]
    result = subprocess.run([*small_files, sys.executable, "-c", job, str(tmp_path / "run")],
                            capture_output=True, text=True, timeout=300,
                            env=dict(os.environ, JAX_PLATFORMS="cpu"))
    assert "PathError: saving a checkpoint into" in result.stdout, result.stderr[-3000:]
    assert "hooks restored: True" in result.stdout, result.stdout
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    assert d2l.saved_steps(tmp_path / "run") == []


def test_save_refuses_a_step_orbax_would_skip(tmp_path):
    with d2l.checkpoint_manager(tmp_path) as manager:
        d2l.save_checkpoint(manager, 5, {"w": np.ones(3)})
        manager.wait_until_finished()
        with pytest.raises(ValueError, match=r"step 3 is not after the latest saved step 5 in "
                                             r".*pass a step > 5"):
            d2l.save_checkpoint(manager, 3, {"w": np.zeros(3)})
    assert d2l.saved_steps(tmp_path) == [5]
    with d2l.checkpoint_manager(tmp_path, read_only=True) as manager:
        with pytest.raises(ValueError, match="did not save step 6: it is read-only"):
            d2l.save_checkpoint(manager, 6, {"w": np.zeros(3)})
    assert d2l.saved_steps(tmp_path) == [5]


def test_train_steps_never_saves_a_diverged_state(run, tmp_path):
    def diverging(params, opt_state, X, y):
        return jax.tree.map(lambda p: p * jnp.nan, params), opt_state, jnp.float32(1.0)
    with d2l.checkpoint_manager(tmp_path) as manager:
        with pytest.raises(FloatingPointError, match=r"the state of step 2 holds NaN or "
                                                     r"infinity in params\.0, params\.1"):
            d2l.train_steps(run["state_0"], diverging, run["loader"](), run["mesh"], 4,
                            manager, save_every=2)
    assert d2l.saved_steps(tmp_path) == []


def test_train_steps_saves_a_plain_iterator_s_state_only(run, tmp_path):
    """Batches from a plain Python iterator: the train state is saved, no data item."""
    grain_iter = run["loader"]()
    plain = iter([next(grain_iter) for _ in range(2)])
    with d2l.checkpoint_manager(tmp_path) as manager:
        d2l.train_steps(run["state_0"], run["step"], plain, run["mesh"], 2, manager, 2)
    assert d2l.saved_steps(tmp_path) == [2]
    assert sorted(p.name for p in (tmp_path / "2").iterdir() if p.is_dir()) == ["state"]


def test_check_finite_names_the_arrays():
    check.finite({"a": np.ones(3), "n": np.arange(3)})
    with pytest.raises(FloatingPointError, match=r"the state holds NaN or infinity in b\.1;"):
        check.finite({"a": np.ones(3), "b": [np.ones(2), np.array([1.0, np.inf])]})


def _bad(call, error, message):
    return pytest.param(call, error, message, id=message[:40])


MESH = lambda: d2l.device_mesh((4, 2))
W = {"w": jax.ShapeDtypeStruct((8, 4), jnp.float32)}


@pytest.mark.parametrize("call,error,message", [
    _bad(lambda t: d2l.checkpoint_manager(None), ValueError,
         "directory must be a folder path (str or pathlib.Path), got None"),
    _bad(lambda t: d2l.checkpoint_manager(""), ValueError, "directory must be a folder path"),
    _bad(lambda t: d2l.checkpoint_manager(t / "file"), NotADirectoryError,
         "is a file, not a folder; pass a folder"),
    _bad(lambda t: d2l.checkpoint_manager(t / "new", max_to_keep=0), ValueError,
         "max_to_keep must be a positive integer or None, got 0"),
    _bad(lambda t: d2l.checkpoint_manager(t / "new", max_to_keep=2.5), ValueError,
         "max_to_keep must be a positive integer or None, got 2.5"),
    _bad(lambda t: d2l.checkpoint_manager(t / "new", create="yes"), ValueError,
         "create must be True or False, got 'yes'"),
    _bad(lambda t: d2l.checkpoint_manager(t / "new", read_only=1), ValueError,
         "read_only must be True or False, got 1"),
    _bad(lambda t: d2l.saved_steps(3), ValueError, "directory must be a folder path"),
    _bad(lambda t: d2l.saved_steps(t / "file"), NotADirectoryError, "is a file"),
    _bad(lambda t: d2l.save_checkpoint("manager", 1, {"w": np.ones(2)}), ValueError,
         "manager must be an Orbax CheckpointManager (d2l.checkpoint_manager), got str"),
    _bad(lambda t: d2l.restore_checkpoint(None, W), ValueError,
         "directory must be a folder path"),
    _bad(lambda t: d2l.restore_checkpoint(t / "file", W), NotADirectoryError, "is a file"),
    _bad(lambda t: d2l.restore_checkpoint(t, None), ValueError, "target holds no arrays"),
    _bad(lambda t: d2l.restore_checkpoint(t, {}), ValueError, "target holds no arrays"),
    _bad(lambda t: d2l.restore_checkpoint(t, {"w": "weights"}), ValueError,
         "target w is a str; give arrays or jax.ShapeDtypeStruct"),
    _bad(lambda t: d2l.restore_checkpoint(t, W, step=-1), ValueError,
         "step must be a non-negative integer or None, got -1"),
    _bad(lambda t: d2l.restore_checkpoint(t, W, step="8"), ValueError,
         "step must be a non-negative integer or None, got '8'"),
    _bad(lambda t: d2l.restore_checkpoint(t, W, data_iter=[1, 2]), ValueError,
         "data_iter must be a Grain iterator (with set_state), got list"),
    _bad(lambda t: d2l.abstract_like(W, "mesh", {"w": P()}), ValueError,
         "mesh must be a jax.sharding.Mesh"),
    _bad(lambda t: d2l.abstract_like(W, MESH(), {"w": None}), ValueError,
         "specs must hold a PartitionSpec for every array, found None; write P()"),
    _bad(lambda t: d2l.abstract_like(W, MESH(), [P()]), ValueError,
         "specs must have the structure of the arrays, one PartitionSpec per array"),
    _bad(lambda t: d2l.abstract_like(W, MESH(), {"w": "model"}), ValueError,
         "found 'model'"),
    _bad(lambda t: d2l.lenet_specs(3), ValueError, "axis must be the name of a mesh axis"),
    _bad(lambda t: d2l.state_specs("adam", [np.ones(2)], [P()]), ValueError,
         "optimizer must be an optax optimizer"),
    _bad(lambda t: d2l.state_specs(optax.sgd(0.1), [np.ones(2), np.ones(3)], [P()]),
         ValueError, "the arrays are 2 in"),
    _bad(lambda t: d2l.sharded_train_state([np.ones(2)], optax.sgd(0.1), None, [P()]),
         ValueError, "mesh must be a jax.sharding.Mesh"),
    _bad(lambda t: d2l.train_steps({}, None, iter([]), MESH(), -1), ValueError,
         "num_steps must be a non-negative integer, got -1"),
    _bad(lambda t: d2l.train_steps({}, lambda *a: a, iter([]), MESH(), 2, save_every=-2),
         ValueError, "save_every must be a non-negative integer, got -2"),
    _bad(lambda t: d2l.train_steps({}, lambda *a: a, [], MESH(), 2), ValueError,
         "batches an iterator: pass iter(loader), not the loader"),
    _bad(lambda t: d2l.train_steps({}, lambda *a: a, iter([]), MESH(), 2, save_every=2),
         ValueError, "save_every=2 needs a manager to save with"),
])
def test_checkpoint_functions_refuse_bad_arguments(tmp_path, call, error, message):
    (tmp_path / "file").write_text("not a folder")
    before = fingerprint(tmp_path)
    with pytest.raises(error) as e:
        call(tmp_path)
    assert message in str(e.value)
    assert fingerprint(tmp_path) == before


@pytest.mark.parametrize("step", [-1, 1.0, True, "2"])
def test_save_checkpoint_refuses_bad_steps_and_states(tmp_path, step):
    with d2l.checkpoint_manager(tmp_path) as manager:
        with pytest.raises(ValueError, match=rf"step must be a non-negative integer, got {step!r}"):
            d2l.save_checkpoint(manager, step, {"w": np.ones(2)})
        with pytest.raises(ValueError, match=r"state holds no arrays"):
            d2l.save_checkpoint(manager, 1, {})
        with pytest.raises(ValueError, match=r"data_iter must be a Grain iterator \(with "
                                             r"get_state\), got int"):
            d2l.save_checkpoint(manager, 1, {"w": np.ones(2)}, data_iter=3)
    assert d2l.saved_steps(tmp_path) == []
