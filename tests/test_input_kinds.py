"""Bad input by kind, generated (Hypothesis): for each kind of input the library's rules
cover (d2l_multi/_checks.py: numbers, labels, arrays, sizes, empty inputs, files, environment
variables) and for the commands' argument parsers, generated bad values get the documented
error type and a one-line message naming the argument, within seconds: nothing hangs, aborts
or returns silently. Good values of every accepted type pass.

The number of examples is bounded (the "ci" profile); ``HYPOTHESIS_PROFILE=thorough`` runs
many more (docs/testing.md).
"""
import contextlib
import gzip
import os
import signal
import socket
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import d2l_multi as d2l
from d2l_multi import _checks as check
from d2l_multi import commands
from d2l_multi import data as dm
from d2l_multi.commands import common, mp_train

settings.register_profile("ci", max_examples=12, deadline=None, derandomize=True,
                          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                 HealthCheck.too_slow])
settings.register_profile("thorough", max_examples=300, deadline=None,
                          suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                 HealthCheck.too_slow])
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

PY = sys.executable
X = np.zeros((64, 28, 28, 1), np.float32)
Y = np.zeros(64, np.int32)


@contextlib.contextmanager
def within(seconds):
    """Fail instead of hanging: a TimeoutError after ``seconds`` (the main thread's alarm)."""
    def alarm(*_):
        raise TimeoutError(f"no answer within {seconds} s")
    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def refused(call, *names, error=d2l.InputError, seconds=30):
    """``call()`` raises ``error`` within ``seconds`` with one line naming each of ``names``;
    returns the message."""
    with within(seconds), pytest.raises(error) as e:
        call()
    message = str(e.value)
    assert message.strip() and "\n" not in message, message
    for name in names:
        assert name in message, (name, message)
    return message


@pytest.fixture(scope="module")
def params():
    return d2l.init_lenet_params(jax.random.key(0))


@pytest.fixture(scope="module")
def replicated(params):
    return d2l.replicate(params, d2l.devices(8))


# ----- numbers -----

not_a_count = st.one_of(
    st.integers(max_value=0), st.booleans(), st.none(), st.text(max_size=3),
    st.floats(allow_nan=True, allow_infinity=True),  # 2.0 is not a count either
    st.integers(-2**62, 0).map(np.int64), st.just(np.float32(2.0)), st.just(np.bool_(True)))
not_a_rate = st.one_of(
    st.floats(max_value=0), st.just(float("nan")), st.just(float("inf")), st.booleans(),
    st.none(), st.text(max_size=3), st.integers(max_value=0), st.just(np.float32("nan")))
a_count = st.one_of(st.integers(1, 10**6), st.integers(1, 10**6).map(np.int64),
                    st.integers(1, 10**6).map(np.int32), st.integers(1, 10**6).map(np.uint16))
a_rate = st.one_of(st.floats(1e-6, 1e3), st.floats(1e-6, 1e3).map(np.float32),
                   st.integers(1, 100), st.integers(1, 100).map(np.int64))


@given(a_count, a_rate)
def test_python_and_numpy_numbers_are_numbers(count, rate):
    check.positive(batch_size=count, num_epochs=count, lr=rate)
    check.integer(1, n=count)
    check.nonnegative(alpha=rate)


@given(not_a_count)
def test_what_is_not_a_count_is_refused_naming_it(value):
    refused(lambda: check.positive(batch_size=value), "batch_size", repr(value))
    if value is not None:  # devices(None): all of them
        refused(lambda: d2l.devices(value), "the number of devices")
    refused(lambda: d2l.time_call(lambda: 1, repeat=value), "repeat")
    refused(lambda: d2l.split_batch(X, Y, value), "devices")
    refused(lambda: d2l.process_batches(X, Y, value), "batch_size")
    refused(lambda: d2l.gpipe_order(value, 4), "num_stages")


@given(not_a_rate)
def test_what_is_not_a_rate_is_refused_naming_it(replicated, value):
    refused(lambda: d2l.train_batch(replicated, X, Y, 8, value), "lr")
    refused(lambda: d2l.train(8, 256, value, 1), "lr")
    refused(lambda: d2l.create_train_state(jax.random.key(0), value, 0.9), "learning_rate")


def test_numpy_numbers_work_where_numbers_are_meant(replicated):
    """np.int64(64) as a batch size, np.float32(.1) as a learning rate."""
    data = d2l.FashionMNIST(np.int64(64), num_train=np.int64(256), num_val=np.int32(64))
    assert len(next(iter(data.get_dataloader(True)))[0]) == 64
    _, loss = d2l.train_batch(replicated, X, Y, np.int64(8), np.float32(0.1))
    assert np.isfinite(loss).all()
    assert d2l.device_mesh((np.int64(2), np.int64(4))).shape == {"data": 2, "model": 4}


# ----- labels -----

def labels_of(kind, values):
    return {"numpy": lambda v: np.asarray(v, np.int32), "jax": lambda v: jnp.asarray(v, jnp.int32),
            "list": lambda v: [int(x) for x in v]}[kind](values)


bad_label = st.one_of(st.integers(10, 2**30), st.integers(-2**30, -1))
kind = st.sampled_from(["numpy", "jax", "list"])


@given(kind, bad_label, st.integers(0, 63))
def test_a_label_out_of_range_is_refused_for_any_array_type(params, replicated, kind, bad,
                                                            where):
    y = labels_of(kind, [bad if i == where else i % 10 for i in range(64)])
    message = refused(lambda: d2l.train_batch(replicated, X, y, 8, 0.1), "y", f"label {bad},")
    assert f"first at index {where}" in message
    refused(lambda: d2l.loss_fn(params, X, y), "y", str(bad))
    refused(lambda: d2l.evaluate_accuracy(params, [(X, y)]), "y", str(bad))


@given(kind, st.integers(0, 63))
def test_labels_past_the_classes_are_refused_in_data_for_train(kind, where):
    class Data:  # a data module whose labels hold a 12: refused before any training
        train = (X, labels_of(kind, [12 if i == where else 0 for i in range(64)]))
    refused(lambda: d2l.train(8, 64, 0.1, 1, Data()), "data.train[1]", "label 12")


@given(st.integers(2, 64), st.sampled_from([np.float32, np.int32]))
def test_one_hot_labels_are_named_as_such(params, n, dtype):
    y = np.eye(10, dtype=dtype)[np.arange(n) % 10]
    message = refused(lambda: d2l.loss_fn(params, X[:n], y), "y")
    assert f"looks one-hot (shape ({n}, 10)): pass class indices, y.argmax(1)" in message


@given(st.sampled_from([np.float32, np.float64, np.bool_]))
def test_labels_that_are_not_integers_are_refused(params, dtype):
    refused(lambda: d2l.loss_fn(params, X, np.zeros(64, dtype)), "y", np.dtype(dtype).name)


@given(st.integers(1, 63))
def test_labels_that_do_not_match_the_examples_are_refused(n):
    for call in (lambda: d2l.split_batch(X, Y[:n], 8), lambda: d2l.ArraySource(X, Y[:n]),
                 lambda: d2l.shard_batch(X, Y[:n], d2l.device_mesh())):
        refused(call, f"{n} labels")


@pytest.fixture(scope="module")
def cnn():
    from flax import nnx
    return d2l.CNN(rngs=nnx.Rngs(0))


@given(bad_label)
def test_flax_steps_check_labels_against_the_model_s_classes(cnn, bad):
    y = np.where(np.arange(8) == 3, bad, 0)
    refused(lambda: d2l.num_correct_nnx(cnn, X[:8], y), "labels", str(bad))


# ----- arrays -----

@given(st.integers(0, 63), st.integers(0, 27), st.integers(0, 27),
       st.sampled_from([np.nan, np.inf, -np.inf]))
def test_a_nan_or_infinity_in_the_images_is_named_with_its_place(replicated, i, h, w, bad):
    images = X.copy()
    images[i, h, w, 0] = bad
    message = refused(lambda: d2l.train_batch(replicated, images, Y, 8, 0.1), "X")
    assert f"at ({i}, {h}, {w}, 0)" in message and ("NaN" in message or "infinity" in message)


@given(st.integers(1, 64), st.sampled_from([(1, 28, 28), (3, 32, 32)]))
def test_nchw_images_are_named_as_such(params, n, chw):
    message = refused(lambda: d2l.lenet(params, np.zeros((n, *chw), np.float32)), "X")
    assert "looks NCHW" in message and "X.transpose(0, 2, 3, 1)" in message


@given(st.lists(st.integers(1, 30), min_size=0, max_size=6).filter(lambda s: len(s) != 4))
def test_images_of_another_rank_are_refused(params, shape):
    refused(lambda: d2l.lenet(params, np.zeros(shape, np.float32)), "X", "4-D")


# ----- sizes -----

@given(st.integers(20_000, 10**6), st.integers(20_000, 10**6))
def test_a_resize_too_large_for_the_memory_is_refused_before_allocating(height, width):
    message = refused(lambda: d2l.FashionMNIST(resize=(height, width)), f"resize=({height}",
                      error=MemoryError)
    assert "GB" in message


@given(st.integers(65, 10**12))
def test_a_batch_larger_than_the_data_is_refused_before_allocating(batch):
    refused(lambda: next(d2l.process_batches(X, Y, batch)), "batch_size", "64 examples")


@given(st.integers(2**40, 2**60))
def test_fits_refuses_what_the_memory_cannot_hold(num_bytes):
    refused(lambda: check.fits(num_bytes, "the thing", "make it smaller"), "the thing",
            "make it smaller", error=MemoryError)


def test_resize_may_be_one_number():
    data = d2l.FashionMNIST(resize=32, num_train=64, num_val=64)
    assert data.train[0].shape == (64, 32, 32, 1) and data.resize == (32, 32)


# ----- empty inputs -----

EMPTY = {
    "evaluate_accuracy([])": lambda p: d2l.evaluate_accuracy(p, []),
    "evaluate_accuracy(iter(()))": lambda p: d2l.evaluate_accuracy(p, iter(())),
    "allreduce([])": lambda p: d2l.allreduce([]),
    "replicate(p, [])": lambda p: d2l.replicate(p, []),
    "replicate({}, devices)": lambda p: d2l.replicate({}, d2l.devices(2)),
    "device_mesh(devices=[])": lambda p: d2l.device_mesh((1,), devices=[]),
    "count_params({})": lambda p: d2l.count_params({}),
    "split_batch(empty)": lambda p: d2l.split_batch(X[:0], Y[:0], 8),
    "loss_fn(empty)": lambda p: d2l.loss_fn(p, X[:0], Y[:0]),
    "bytes_per_device([])": lambda p: d2l.bytes_per_device([]),
}


@pytest.mark.parametrize("call", EMPTY.values(), ids=EMPTY.keys())
def test_empty_inputs_are_refused_not_divided_by(params, call):
    refused(lambda: call(params))


@given(st.integers(0, 7), st.integers(2, 8))
def test_a_device_listed_twice_is_refused(params, i, n):
    devices = d2l.devices(8)[:n]
    twice = devices + [devices[i % n]]
    message = refused(lambda: d2l.replicate(params, twice), "devices", "twice")
    refused(lambda: d2l.device_mesh((len(twice),), devices=twice), "twice")
    assert str(devices[i % n]) in message


# ----- files -----

@pytest.fixture()
def specials(tmp_path):
    """A FIFO, a socket and a character device, where files are expected."""
    os.mkfifo(tmp_path / "fifo")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(tmp_path / "socket"))
    yield {"FIFO": tmp_path / "fifo", "socket": tmp_path / "socket", "device": "/dev/null"}
    server.close()


@pytest.mark.parametrize("kind", ["FIFO", "socket", "device"])
def test_only_regular_files_are_read(specials, kind):
    path = specials[kind]
    refused(lambda: dm.read_idx_gz(path), str(path), kind.lower() if kind != "FIFO" else kind,
            error=d2l.errors.PathError, seconds=10)


@given(st.integers(1, 50), st.integers(2, 20))
def test_decompression_stops_at_the_expected_size(tmp_path_factory, size, factor):
    """A gzip bomb (or any file that decompresses to more than it should) is refused after
    reading just past the bound, never decompressed whole."""
    path = tmp_path_factory.mktemp("bomb") / "train-images-idx3-ubyte.gz"
    with gzip.open(path, "wb") as f:
        f.write(bytes(size * factor * 1000))
    refused(lambda: dm.read_idx_gz(path, max_bytes=size * 1000), str(path), "gzip bomb",
            error=d2l.DataError)


@given(st.sampled_from(["file", "under_file", "folder_for_a_file"]))
def test_an_output_folder_is_checked_before_any_work(tmp_path_factory, case):
    root = tmp_path_factory.mktemp("out")
    (root / "file").write_text("mine")
    (root / "run" / "log.json").mkdir(parents=True)
    out = {"file": root / "file", "under_file": root / "file" / "run",
           "folder_for_a_file": root / "run"}[case]
    refused(lambda: common.check_out(out, ["log.json"]), str(out), error=OSError)


# ----- environment variables -----

switch_words = ["1", "0", "true", "false", "yes", "no", "on", "off", ""]


@given(st.text(max_size=8).filter(lambda t: t.strip().lower() not in switch_words))
def test_a_switch_accepts_only_its_words(text):
    assume("\x00" not in text)
    message = refused(lambda: check.env_flag("D2L_MULTI_SMOKE", {"D2L_MULTI_SMOKE": text}),
                      "D2L_MULTI_SMOKE", "1, 0, true, false, yes, no, on, off")
    assert repr(text) in message


@given(st.sampled_from(switch_words), st.booleans(), st.sampled_from(["", " ", "\t"]))
def test_a_switch_reads_its_words_in_any_case(word, upper, space):
    text = space + (word.upper() if upper else word) + space
    assert check.env_flag("X", {"X": text}) == (word in ("1", "true", "yes", "on"))


@given(st.text(alphabet="abcxyz/_-", min_size=1, max_size=12))
def test_a_data_folder_that_does_not_exist_is_named_not_replaced(tmp_path_factory, name):
    missing = tmp_path_factory.mktemp("data") / "no" / name
    refused(lambda: check.env_folder(dm.DATA_ENV, {dm.DATA_ENV: str(missing)}), dm.DATA_ENV,
            str(missing), error=FileNotFoundError)


@pytest.mark.parametrize("env,code,message", [
    ({"D2L_MULTI_SMOKE": "2"}, "import d2l_multi as d2l; d2l.FashionMNIST()",
     "D2L_MULTI_SMOKE='2' is not a switch"),
    ({"JAX_PLATFORMS": "cuda"}, "import d2l_multi as d2l; d2l.simulate_devices(8)",
     "JAX_PLATFORMS='cuda' names a platform this machine lacks"),
    ({"KERAS_BACKEND": "tensorflow"}, "import d2l_multi as d2l; d2l.keras_convnet()",
     "KERAS_BACKEND='tensorflow', but these functions need 'jax'"),
    ({"D2L_MULTI_DATA": "/nonexistent"}, "import d2l_multi as d2l; d2l.FashionMNIST()",
     "D2L_MULTI_DATA=/nonexistent does not exist"),
])
def test_an_environment_variable_the_machine_cannot_honour_is_one_line(env, code, message):
    if env.get("JAX_PLATFORMS") == "cuda" and any("cuda" in ep.name for ep in
                                                  __import__("importlib.metadata").metadata
                                                  .entry_points(group="jax_plugins")):
        pytest.skip("this machine has JAX's CUDA plugin")
    result = subprocess.run([PY, "-c", code], capture_output=True, text=True, timeout=120,
                            env={**os.environ, **env})
    assert result.returncode != 0 and message in result.stderr.strip().splitlines()[-1], \
        result.stderr[-2000:]


# ----- the commands' argument parsers -----

def one_line_exit(argv, capsys, status=2):
    capsys.readouterr()
    with within(30):
        code = commands.main(argv)
    err = capsys.readouterr().err.strip()
    assert code == status and len(err.splitlines()) == 1, (code, err)
    return err


bad_number_text = st.one_of(
    st.sampled_from(["0", "-1", "nan", "inf", "-inf", "1e999", "", " ", "ten", "0x10", "2.5.1"]),
    st.integers(max_value=0).map(str))


@given(st.sampled_from(["--epochs", "--batch-size", "--lr", "--cpu-devices"]), bad_number_text)
def test_train_s_parser_refuses_bad_numbers_naming_the_option(capsys, option, text):
    assume(not (option == "--lr" and text.strip().startswith("0x")))
    err = one_line_exit(["train", option, text], capsys)
    assert option in err


@given(st.sampled_from(["--devices"]), st.sampled_from(["0", "-2", "two", "1,,2", "all,0"]))
def test_train_s_device_counts_are_checked(capsys, option, text):
    assert option in one_line_exit(["train", option, text], capsys)


@given(st.sampled_from(["--epochs", "--batch-size", "--lr", "--num-train", "--num-val",
                        "--steps", "--save-every", "--crash-at-step"]), bad_number_text)
def test_mp_train_s_parser_refuses_bad_numbers_naming_the_option(capsys, option, text):
    capsys.readouterr()
    with within(30):
        code = mp_train.main([option, text])
    err = capsys.readouterr().err.strip()
    assert code == 2 and len(err.splitlines()) == 1 and option in err, err


@given(st.sampled_from(["--processes", "--devices-per-process", "--heartbeat-timeout",
                        "--collective-timeout", "--port"]),
       st.one_of(st.integers(max_value=0), st.integers(70_000, 10**9)).map(str))
def test_launch_refuses_bad_settings_before_starting_anything(capsys, option, text):
    assume(not (option in ("--devices-per-process", "--heartbeat-timeout",
                           "--collective-timeout") and int(text) > 0))
    err = one_line_exit(["launch", option, text, "--", PY, "-c", "pass"], capsys)
    assert option in err


@given(st.sampled_from(["--grace-period", "--timeout"]),
       st.sampled_from(["-1", "nan", "inf", "-inf", "x"]))
def test_launch_refuses_bad_seconds(capsys, option, text):
    assume(not (option == "--grace-period" and text == "x"))
    err = one_line_exit(["launch", option, text, "--", PY, "-c", "pass"], capsys)
    assert option in err or "invalid float value" in err


@given(st.sampled_from(["lenet", "profile", "collectives", "predict", "models"]),
       st.sampled_from(["--batch-size", "--repeat", "--steps", "--devices", "--width"]),
       st.sampled_from(["0", "-3", "x"]))
def test_benchmark_refuses_bad_numbers(capsys, sub, option, text):
    """Every option takes a positive number, or is not one of the benchmark's."""
    err = one_line_exit(["benchmark", sub, option, text], capsys)
    assert option in err


def test_book_refuses_an_out_that_is_a_file(tmp_path, capsys):
    (tmp_path / "file").write_text("mine")
    err = one_line_exit(["book", "--no-execute", "--out", str(tmp_path / "file")], capsys, 1)
    assert str(tmp_path / "file") in err and (tmp_path / "file").read_text() == "mine"
