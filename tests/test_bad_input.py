"""Bad input to the core library (devices, data, collectives, data parallelism, helpers) is
refused at the boundary with one message that names the value and the fix."""
import re

import jax
import numpy as np
import pytest

import d2l_multi as d2l
from d2l_multi import _checks as check
from d2l_multi.data import dataset_dir
from d2l_multi.errors import TooLargeError

X = np.zeros((64, 28, 28, 1), np.float32)
Y = np.zeros(64, np.int32)


def replicated():
    return d2l.replicate(d2l.init_lenet_params(jax.random.key(0)), d2l.devices(8))


CASES = [
    ("devices(0)", lambda: d2l.devices(0), "must be a positive integer, got 0"),
    ("devices(99)", lambda: d2l.devices(99), "asked for 99 devices but JAX sees only 8"),
    ("devices('8')", lambda: d2l.devices("8"), "must be a positive integer, got '8'"),
    ("simulate_devices(-1)", lambda: d2l.simulate_devices(-1), "positive integer, got -1"),
    ("device_mesh((0,))", lambda: d2l.device_mesh((0,)), "sizes must be positive integers"),
    ("check_divisible(10, 0)", lambda: check.divisible(10, 0),
     "the number of devices must be a positive integer, got 0"),
    ("check_divisible(250, 8)", lambda: check.divisible(250, 8),
     "batch size 250 does not divide evenly over 8 devices; use a multiple of 8, e.g. 248 or 256"),
    ("split_batch(..., 0)", lambda: d2l.split_batch(X, Y, 0), "positive integer, got 0"),
    ("split_batch(X, y[:10])", lambda: d2l.split_batch(X, Y[:10], 8),
     "X has 64 examples but y has 10 labels"),
    ("split_batch(..., 3)", lambda: d2l.split_batch(X, Y, 3), "e.g. 63 or 66"),
    ("train_batch(..., 0)", lambda: d2l.train_batch(replicated(), X, Y, 0, 0.1),
     "positive integer, got 0"),
    ("train(16 devices)", lambda: d2l.train(16, 256, 0.1, 1), "asked for 16 devices"),
    ("train(batch 250)", lambda: d2l.train(8, 250, 0.1, 1), "batch size 250 does not divide"),
    ("train(lr nan)", lambda: d2l.train(8, 256, float("nan"), 1), "lr must be a finite positive"),
    ("train(lr -1)", lambda: d2l.train(8, 256, -1.0, 1), "lr must be a finite positive"),
    ("train(0 epochs)", lambda: d2l.train(8, 256, 0.1, 0), "num_epochs must be a positive"),
    ("train(2.5 epochs)", lambda: d2l.train(8, 256, 0.1, 2.5), "num_epochs must be a positive"),
    ("replicate(params, [])", lambda: d2l.replicate([np.ones(2)], []), "at least one device"),
    ("allreduce([])", lambda: d2l.allreduce([]), "one array per device, got []"),
    ("time_call(repeat=0)", lambda: d2l.time_call(lambda: 1, repeat=0), "repeat must be"),
    ("time_call(warmup=-1)", lambda: d2l.time_call(lambda: 1, warmup=-1), "warmup must be"),
    ("FashionMNIST(batch 0)", lambda: d2l.FashionMNIST(0), "batch_size must be a positive"),
    ("FashionMNIST(resize 0)", lambda: d2l.FashionMNIST(resize=(0, 28)), r"resize=\(0, 28\)"),
    ("load_data_fashion_mnist(-1)", lambda: d2l.load_data_fashion_mnist(-1),
     "batch_size must be a positive integer, got -1"),
    ("dataset_dir('cifar')", lambda: dataset_dir("cifar"), "unknown dataset 'cifar'"),
    # a label outside 0..9 would silently count as another class (JAX clamps indices)
    ("train_batch(y=-1)", lambda: d2l.train_batch(replicated(), X, np.full(64, -1), 8, 0.1),
     "y holds the label -1, but labels are class indices from 0 to 9"),
    ("split_batch(y=-3)", lambda: d2l.split_batch(X, np.full(64, -3), 8), "the label -3"),
    ("shard_batch(y=-1)", lambda: d2l.shard_batch(X, np.full(64, -1), d2l.device_mesh()),
     "the label -1"),
    ("loss_fn(y=10)", lambda: d2l.loss_fn(d2l.init_lenet_params(jax.random.key(0)), X,
                                          np.full(64, 10)),
     "y holds the label 10, but labels are class indices from 0 to 9"),
    ("ArraySource(y=-1)", lambda: d2l.ArraySource(X, np.full(64, -1)), "the label -1"),
    ("process_batches(y=-1)", lambda: list(d2l.process_batches(X, np.full(64, -1), 8)),
     "the label -1"),
]


@pytest.mark.parametrize("call,message", [(f, m) for _, f, m in CASES],
                         ids=[name for name, _, _ in CASES])
def test_bad_input_is_refused_with_the_fix(call, message):
    with pytest.raises(ValueError, match=re.escape(message) if "\\" not in message else message):
        call()


# ----- values that used to pass silently, hang or abort the process -----

def test_train_refuses_out_of_range_labels_in_its_data_before_training():
    data = d2l.FashionMNIST(256)
    data.train[1][:50] = 12  # 50 labels outside the 10 classes
    with pytest.raises(d2l.InputError, match=r"label 12.*from 0 to 9") as e:
        d2l.train(8, 256, 0.1, 1, data)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("y,bad", [
    (jax.numpy.zeros(64, jax.numpy.int32).at[3].set(-1), -1),  # a JAX array
    (np.where(np.arange(64) == 5, 10, 0).astype(np.int32), 10),  # NumPy, past the last class
    ([0] * 63 + [11], 11),                                       # a list
])
def test_train_batch_checks_the_labels_of_any_array_type(y, bad):
    with pytest.raises(d2l.InputError, match=rf"y holds the label {bad}\b.*from 0 to 9"):
        d2l.train_batch(replicated(), X, y, 8, 0.1)


def _run_python(code, timeout):
    """Run ``code`` in a fresh Python (8 simulated devices): (status, stderr's last line)."""
    import subprocess
    import sys
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=timeout)
    lines = result.stderr.strip().splitlines() or [""]
    return result.returncode, lines[-1]


def test_a_checkpoint_whose_array_files_are_fifos_is_refused_within_seconds(tmp_path):
    """Reading a FIFO waits for a writer forever (and Ctrl-C with it): refused, naming it."""
    code = f"""
import os, pathlib, numpy as np
import d2l_multi as d2l
d2l.simulate_devices(8)
folder = pathlib.Path({str(tmp_path / "run")!r})
state = {{"w": np.ones(10, np.float32)}}
with d2l.checkpoint_manager(folder) as manager:
    d2l.save_checkpoint(manager, 1, state)
    d2l.wait_for_saves(manager)
for path in [p for p in folder.rglob("*") if p.is_file() and "/d/" in str(p)]:
    path.unlink()
    os.mkfifo(path)
try:
    d2l.restore_checkpoint(folder, state)
except OSError as e:
    raise SystemExit(f"{{type(e).__name__}}: {{e}}")
"""
    status, line = _run_python(code, timeout=120)
    assert status == 1 and line.startswith("PathError: ") and "FIFO" in line, line
    assert str(tmp_path / "run" / "1") in line


def test_a_resize_the_machine_cannot_hold_is_refused_with_the_figure():
    """Not an abort of the process (XLA's check failure would end a notebook's kernel)."""
    code = """
import d2l_multi as d2l
try:
    d2l.FashionMNIST(resize=(4000, 4000))
except MemoryError as e:
    raise SystemExit(f"{type(e).__name__}: {e}")
"""
    status, line = _run_python(code, timeout=120)
    assert status == 1 and line.startswith("TooLargeError: resize=(4000, 4000)"), line
    assert "GB" in line


def test_a_second_train_run_into_the_same_out_is_refused_at_once(tmp_path, capsys):
    import fcntl

    from d2l_multi import commands
    out = tmp_path / "tw"
    out.mkdir()
    with open(out / ".lock", "a") as lock:  # a run holds the folder
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        status = commands.main(["train", "--devices", "8", "--cpu-devices", "8",
                                "--epochs", "1", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert status == 1 and f"--out {out} is in use by another run" in err
    assert len(err.splitlines()) == 1 and not (out / "results.json").exists()


# ----- what used to work with a wrong, late or long message: one line, naming the value -----

def _data_with(**change):
    class Data:  # a data module holding one bad thing
        train = (change.get("X", X), change.get("y", Y))
    return Data()


NAN_PIXEL = X.copy()
NAN_PIXEL[5, 3, 4, 0] = np.nan

POOR = [
    ("train(one NaN pixel)", lambda: d2l.train(8, 64, 0.1, 1, _data_with(X=NAN_PIXEL)),
     "data.train[0] holds NaN at (5, 3, 4, 0)"),
    ("loss_fn(one-hot y)", lambda: d2l.loss_fn(d2l.init_lenet_params(jax.random.key(0)), X,
                                               np.eye(10, dtype=np.float32)[Y]),
     "y looks one-hot (shape (64, 10)): pass class indices, y.argmax(1)"),
    ("train_batch(empty batch)", lambda: d2l.train_batch(replicated(), X[:0], Y[:0], 8, 0.1),
     "X is an empty batch (0 examples)"),
    ("lenet(NCHW)", lambda: d2l.lenet(d2l.init_lenet_params(jax.random.key(0)),
                                      X.transpose(0, 3, 1, 2)),
     "X has shape (64, 1, 28, 28), which looks NCHW; the chapter's images are NHWC (batch, "
     "height, width, channels): X.transpose(0, 2, 3, 1)"),
    ("replicate(duplicate devices)", lambda: d2l.replicate([np.ones(2)], [d2l.devices(1)[0]] * 2),
     f"devices lists {d2l.devices(1)[0]} twice"),
    ("device_mesh(duplicate devices)", lambda: d2l.device_mesh((2,), devices=[
        d2l.devices(1)[0]] * 2), "twice"),
    ("process_batches(10**9)", lambda: d2l.process_batches(X, Y, 10**9),
     "batch_size=1000000000 is larger than the data (64 examples)"),
    ("evaluate_accuracy(p, [])", lambda: d2l.evaluate_accuracy(
        d2l.init_lenet_params(jax.random.key(0)), []), "data_iter is empty"),
    ("evaluate_accuracy(p, iter([]))", lambda: d2l.evaluate_accuracy(
        d2l.init_lenet_params(jax.random.key(0)), iter([])), "data_iter yielded no batches"),
]


@pytest.mark.parametrize("call,message", [(f, m) for _, f, m in POOR],
                         ids=[name for name, _, _ in POOR])
def test_poor_cases_get_one_line_naming_the_value(call, message):
    with pytest.raises(ValueError) as e:
        call()
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_numpy_numbers_are_numbers():
    check.positive(batch_size=np.int64(64), lr=np.float32(0.1), num_epochs=np.int32(2))
    data = d2l.FashionMNIST(np.int64(64), num_train=256)
    assert data.batch_size == 64 and len(data.train[0]) == 256


def test_resize_of_one_number_is_a_square():
    assert d2l.FashionMNIST(resize=32, num_train=64, num_val=64).train[0].shape[1:] == (32, 32, 1)


@pytest.mark.parametrize("value", ["2", "y", "enabled", "maybe"])
def test_the_smoke_switch_refuses_what_it_does_not_know(monkeypatch, value):
    from d2l_multi.smoke_switch import smoke
    monkeypatch.setenv("D2L_MULTI_SMOKE", value)
    with pytest.raises(d2l.InputError, match=rf"D2L_MULTI_SMOKE='{value}' is not a switch; set "
                                             rf"it to one of 1, 0, true, false, yes, no, on, off"):
        smoke()


def test_a_data_folder_that_does_not_exist_is_refused(monkeypatch):
    from d2l_multi import data
    monkeypatch.setenv("D2L_MULTI_DATA", "/nonexistent")
    data._load_cached.cache_clear()
    with pytest.raises(FileNotFoundError, match="D2L_MULTI_DATA=/nonexistent does not exist"):
        d2l.FashionMNIST()


def test_a_failed_write_names_the_file(tmp_path):
    import errno

    from d2l_multi.commands.common import save_atomic

    def full(tmp):
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(OSError, match=rf"cannot write {tmp_path / 'params.npz'} \(No space "
                                      rf"left on device"):
        save_atomic(tmp_path / "params.npz", full)
    assert list(tmp_path.iterdir()) == []


# ----- values a hostile reader found passing silently or ending in another library's error --

def _one_device_params():
    return [jax.numpy.ones(3)]  # on one device: no stack of copies


FOUND = [
    ("unreplicate(unstacked)", lambda: d2l.unreplicate(_one_device_params()),
     "params must hold device copies stacked along axis 0"),
    ("max_difference(complex)", lambda: d2l.max_difference(np.array([1 + 5j]),
                                                           np.array([1 + 0j])), None),
    ("max_difference({}, {})", lambda: d2l.max_difference({}, {}), "nothing to compare"),
    ("max_difference(list, tuple)", lambda: d2l.max_difference([X], (X,)),
     "the trees differ in structure"),
    ("max_difference(strings)", lambda: d2l.max_difference(np.array(["a"]), np.array(["b"])),
     "compare numbers"),
    ("train(batch 256, data of 128)", lambda: d2l.train(
        8, 256, 0.1, 1, d2l.FashionMNIST(128, num_train=512, num_val=256)),
     "batch_size=256 but data makes batches of 128"),
    ("train(data=[1, 2])", lambda: d2l.train(8, 64, 0.1, 1, [1, 2]),
     "data must be a data module"),
    ("FashionMNIST(data_dir=a file)", lambda: d2l.FashionMNIST(32, data_dir=__file__),
     "is a file, not a folder"),
    ("FashionMNIST(data_dir='')", lambda: d2l.FashionMNIST(32, data_dir=""),
     "data_dir must be a folder path"),
    ("predict_step_time(overlap='no')", lambda: d2l.predict_step_time(
        0.1, 8, 1e6, 1e-5, 1e-9, overlap="no"), "overlap must be True or False, got 'no'"),
    ("process_batches(shuffle='no')", lambda: next(d2l.process_batches(X, Y, 4, shuffle="no")),
     "shuffle must be True or False, got 'no'"),
    ("get_dataloader('no')", lambda: d2l.FashionMNIST(32).get_dataloader("no"),
     "train must be True or False, got 'no'"),
    ("text_labels([-1])", lambda: d2l.FashionMNIST(32).text_labels([-1]), "-1"),
    ("text_labels([10])", lambda: d2l.FashionMNIST(32).text_labels([10]), "10"),
    ("text_labels([1.7])", lambda: d2l.FashionMNIST(32).text_labels([1.7]), "indices"),
    ("training_memory(param_shards=0.5)", lambda: d2l.training_memory(
        1000, param_shards=0.5), "param_shards must be a positive integer, got 0.5"),
    ("time_collective(repeat=1.5)", lambda: d2l.time_collective("psum", 2, 64, repeat=1.5),
     "repeat must be a positive integer, got 1.5"),
    ("measure_collectives('psum', ...)", lambda: d2l.measure_collectives("psum", [2], [64]),
     "collectives must be a list, got 'psum'"),
]


@pytest.mark.parametrize("call,message", [(f, m) for _, f, m in FOUND],
                         ids=[name for name, _, _ in FOUND])
def test_what_passed_silently_is_refused_in_one_line(call, message):
    if message is None:  # not refused: computed right
        assert call() == 5.0
        return
    with pytest.raises((ValueError, OSError)) as e:
        call()
    assert type(e.value).__module__ == "d2l_multi.errors", repr(e.value)  # the package's own
    assert message in str(e.value) and "\n" not in str(e.value), str(e.value)


def test_max_difference_is_exact_for_integers_and_flags_arrive_as_numpy_bools(tmp_path):
    assert d2l.max_difference(np.array([2**63 - 1]), np.array([2**63 - 2])) == 1.0
    with d2l.checkpoint_manager(tmp_path, create=np.bool_(True)) as manager:
        assert manager.directory.name == tmp_path.name


def test_a_state_whose_step_disagrees_is_refused_at_save_not_at_restore(tmp_path):
    state = {"w": jax.numpy.ones(3), "step": jax.numpy.array(5)}
    with d2l.checkpoint_manager(tmp_path / "c") as manager:
        with pytest.raises(d2l.InputError, match=r"state\['step'\] is 5 but it would be "
                                                  r"saved as step 7"):
            d2l.save_checkpoint(manager, 7, state)
        with pytest.raises(d2l.InputError, match=r"state\['name'\] is 'abc', not an array"):
            d2l.save_checkpoint(manager, 5, {**state, "name": "abc"})
        d2l.save_checkpoint(manager, 5, {**state, "lr": 0.1})  # a plain number is saved
        d2l.wait_for_saves(manager)
    assert d2l.saved_steps(tmp_path / "c") == [5]


@pytest.mark.parametrize("argv", [["train", "--out", ""], ["book", "--out", " "],
                                  ["book", "--chapters", "a\0b"], ["classroom", "student", ""]])
def test_an_empty_path_argument_is_refused_not_taken_for_the_current_folder(argv, capsys):
    from d2l_multi.commands import main
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "expected a path, got" in err and err.count("\n") == 1, err


def test_mp_train_refuses_an_empty_out(capsys):
    from d2l_multi.commands import mp_train
    with pytest.raises(SystemExit) as e:
        mp_train.parser().parse_args(["--out", ""])
    assert e.value.code == 2 and "expected a path, got ''" in capsys.readouterr().err


@pytest.mark.parametrize("call,message", [
    (lambda: d2l.avg_pool2d(X, 100), "the pooling window (100 x 100) is larger than the images"),
    (lambda: d2l.conv2d(X, np.ones((30, 30, 1, 4), np.float32), np.zeros(4, np.float32)),
     "the kernel (30 x 30) is larger than the images (28 x 28)"),
    (lambda: d2l.conv2d(X, np.ones((3, 3, 1, 4), np.float32), np.zeros(5, np.float32)),
     "b has shape (5,); pass one bias per output channel, shape (4,)"),
    (lambda: d2l.device_mesh((2, 4), axis_names=("a", "a")), "one distinct name per axis"),
    (lambda: d2l.device_mesh((8,), axis_names="data"), "axis_names='data'"),
    (lambda: d2l.device_mesh((2, 4), axis_names=(1, 2)), "one distinct name per axis"),
])
def test_a_window_larger_than_the_images_and_bad_axis_names_are_refused(call, message):
    with pytest.raises(d2l.InputError) as e:
        call()
    assert message in str(e.value), str(e.value)


def test_device_mesh_takes_a_grid_of_devices():
    grid = np.array(d2l.devices(8)).reshape(2, 4)
    assert d2l.device_mesh((2, 4), devices=grid).shape == {"data": 2, "model": 4}


@pytest.mark.parametrize("call,message", [
    (lambda: d2l.allreduce(jax.numpy.ones(3)),
     "allreduce needs a list with one array per device, got ArrayImpl"),
    (lambda: d2l.allreduce([np.ones(3), np.ones(3)]), "allreduce needs JAX arrays of one shape"),
    (lambda: d2l.allreduce([jax.numpy.ones(3), jax.numpy.ones(2)]), "[(3,), (2,)]"),
    (lambda: d2l.mse(jax.numpy.ones((0, 2)), jax.numpy.ones((0, 2))), "Y is empty"),
    (lambda: d2l.pipeline_schedule([[], []]), "hold no pass"),
])
def test_empty_and_mixed_inputs_are_refused(call, message):
    with pytest.raises(d2l.InputError) as e:
        call()
    assert message in str(e.value), str(e.value)


def test_sizes_past_the_memory_are_refused_before_any_allocation(monkeypatch):
    monkeypatch.setattr(check, "available_memory", lambda: 2**30)
    with pytest.raises(TooLargeError, match="1000 blocks of width 100000"):
        d2l.init_residual_mlp(jax.random.key(0), 1000, 10**5, 10**5)
    with pytest.raises(TooLargeError, match="num_bytes=4503599627370496"):
        d2l.collective_loop("psum", 2, 2**52)


@pytest.mark.parametrize("chapters,what", [("/nonexistent/chapters", "does not exist"),
                                           (__file__, "is a file")])
def test_book_names_a_chapters_folder_that_is_not_one(chapters, what, capsys):
    from d2l_multi.commands import main
    assert main(["book", "--chapters", chapters]) == 2
    err = capsys.readouterr().err
    assert f"--chapters {chapters} {what}; pass the folder of the notebooks" in err, err


def test_a_count_given_twice_is_measured_once():
    from d2l_multi.commands.benchmark import _counts
    assert _counts("--devices", "2,4,2", 2, "2,4,8") == [2, 4]


@pytest.mark.parametrize("sizes", [None, ["a", "b"], [1j, 2], {"a": 1}])
def test_fit_alpha_beta_names_what_is_not_a_list_of_numbers(sizes):
    with pytest.raises(d2l.InputError, match="num_bytes must be a list of numbers, got"):
        d2l.fit_alpha_beta(sizes, [1e-5, 2e-5])


def test_conv2d_takes_one_bias_for_all_channels():
    W = np.ones((3, 3, 1, 4), np.float32)
    assert d2l.conv2d(X[:2], W, 0.5).shape == (2, 26, 26, 4)
