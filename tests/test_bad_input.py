"""Bad input to the core library (devices, data, collectives, data parallelism, helpers) is
refused at the boundary with one message that names the value and the fix."""
import re

import jax
import numpy as np
import pytest

import d2l_multi as d2l
from d2l_multi import _checks as check
from d2l_multi.data import dataset_dir

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
     "y holds the label -1, but labels are class indices from 0 up"),
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
