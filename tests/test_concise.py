"""Bad input to the concise data-parallel helpers fails early, naming the value and the fix."""
import os
import subprocess
import sys

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

import d2l_multi as d2l
from d2l_multi import _checks as check


@pytest.fixture(scope="module")
def mesh():
    return d2l.device_mesh()


def test_device_mesh_is_one_auto_axis_over_all_devices(mesh):
    assert mesh.axis_names == ("data",)
    assert mesh.shape["data"] == len(jax.devices())
    assert mesh.axis_types == (jax.sharding.AxisType.Auto,)


def test_device_mesh_of_n_uses_the_first_n_devices():
    mesh = d2l.device_mesh((4,))
    assert list(mesh.devices.flat) == jax.devices()[:4]
    assert d2l.device_mesh((2, -1)).shape == {"data": 2, "model": len(jax.devices()) // 2}


def test_mesh_larger_than_devices_says_how_many_exist_and_how_to_get_more():
    n = len(jax.devices())
    with pytest.raises(ValueError) as e:
        d2l.device_mesh((n + 1,))
    message = str(e.value)
    assert f"asked for {n + 1} devices" in message and f"only {n}" in message
    assert f"simulate_devices({n + 1})" in message


def test_batch_not_divisible_names_sizes_that_work(mesh):
    X, y = np.zeros((10, 28, 28, 1), np.float32), np.zeros(10, np.int32)
    with pytest.raises(ValueError, match=r"batch size 10 .* 8 devices; use a multiple of 8, "
                                         r"e\.g\. 8 or 16"):
        d2l.shard_batch(X, y, mesh)


def test_spec_naming_a_missing_axis_lists_the_mesh_axes(mesh):
    with pytest.raises(ValueError) as e:
        d2l.shard(np.zeros((8, 4)), mesh, P("batch"))
    message = str(e.value)
    assert "'batch'" in message and "('data',)" in message
    assert "axis_names=('batch',)" in message  # the fix: rename, or build the mesh so


def test_shard_batch_with_an_axis_the_mesh_lacks(mesh):
    with pytest.raises(ValueError, match="mesh has only the axes"):
        d2l.shard_batch(np.zeros((8, 2)), np.zeros(8), mesh, axis_name="batch")


def test_dimension_not_divisible_by_its_mesh_axis(mesh):
    with pytest.raises(ValueError, match=r"dimension 1 .*: size 10 .* multiple of 8, "
                       r"e\.g\. 8 or 16"):
        d2l.shard(np.zeros((4, 10)), mesh, P(None, "data"))


def test_good_specs_pass_and_shard_replicates_by_default(mesh):
    check.spec(P(None, ("data",)), mesh, (3, 16))
    check.spec(P(), mesh, (5,))
    x = d2l.shard(np.arange(6.0), mesh)
    assert x.sharding.spec == P() and len(x.addressable_shards) == len(jax.devices())
    Xs, ys = d2l.shard_batch(np.zeros((16, 2)), np.zeros(16), mesh)
    assert Xs.sharding.spec == ys.sharding.spec == P("data")
    assert Xs.addressable_shards[0].data.shape == (16 // len(jax.devices()), 2)


def test_steps_refuse_what_is_not_an_optax_optimizer(mesh):
    for make in (d2l.make_train_step, lambda opt: d2l.make_shard_map_step(mesh, opt)):
        with pytest.raises(TypeError, match=r"optax optimizer such as optax\.sgd\(0\.1\)"):
            make(0.1)


def test_shard_map_step_with_an_axis_the_mesh_lacks(mesh):
    import optax
    with pytest.raises(ValueError, match="mesh has only the axes"):
        d2l.make_shard_map_step(mesh, optax.sgd(0.1), axis_name="batch")


def test_count_collectives_reads_hlo_text():
    hlo = """
  %all-reduce.1 = f32[10]{0} all-reduce(f32[10]{0} %p), channel_id=1, to_apply=%add
  %ar = (f32[2]{0}, f32[]) all-reduce(f32[2]{0} %a, f32[] %b), to_apply=%add
  %all-gather-start = (f32[4]{0}, f32[16]{0}) all-gather-start(f32[4]{0} %w), dimensions={0}
  %all-gather-done = f32[16]{0} all-gather-done((f32[4]{0}, f32[16]{0}) %all-gather-start)
  %rs = f32[2]{0} reduce-scatter(f32[16]{0} %g), dimensions={0}, to_apply=%add
  %add.3 = f32[] add(f32[] %x, f32[] %y)
"""
    assert d2l.count_collectives(hlo) == {"all-reduce": 2, "all-gather": 1, "reduce-scatter": 1,
                                          "all-to-all": 0, "collective-permute": 0}


def test_count_collectives_refuses_a_compiled_program():
    compiled = jax.jit(lambda x: x + 1).lower(1.0).compile()
    with pytest.raises(TypeError, match=r"not a Compiled\W+pass .*\.as_text\(\)"):
        d2l.count_collectives(compiled)


def test_importing_d2l_multi_does_not_import_keras():
    """Keras picks its backend on first import: importing d2l_multi must leave that choice open
    (without KERAS_BACKEND, Keras would pick TensorFlow, which is not installed)."""
    env = {k: v for k, v in os.environ.items() if k != "KERAS_BACKEND"}
    code = "import sys, d2l_multi; assert 'keras' not in sys.modules, 'keras was imported'"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)


SHOWN = ["allreduce", "replicate", "ring_allreduce", "count_collectives", "make_train_step",
         "make_shard_map_step", "nnx_train_step", "evaluate_nnx", "train_nnx",
         "jit_train_step", "keras_train_state", "make_keras_train_step"]


def public(name):
    return getattr(d2l, name)


@pytest.mark.parametrize("name", SHOWN)
def test_shown_code_holds_no_argument_checks_and_fits_80_columns(name):
    """The chapter shows these functions as the library defines them (inspect.unwrap): the
    argument checks live in the validation layer around them, and every line fits the page."""
    import inspect
    source = inspect.getsource(inspect.unwrap(public(name)))
    assert "check_" not in source and "isinstance(" not in source, source
    assert max(len(line) for line in source.splitlines()) <= 80


def test_the_validation_layer_keeps_the_shown_function():
    import inspect
    for name in ("allreduce", "replicate", "make_train_step", "make_shard_map_step",
                 "count_collectives", "train_nnx"):
        checked = public(name)
        assert inspect.unwrap(checked) is not checked, f"{name} is not validated"
