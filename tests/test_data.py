"""The loader: IDX parsing, every bad-input error, lookup order, offline download, real data."""
import gzip
import hashlib

import numpy as np
import pytest

import d2l_multi as d2l
from d2l_multi import data as dm
from d2l_multi.data import MNIST
from d2l_multi.smoke_switch import SMOKE_ENV

FILES = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
         "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}


def idx_bytes(array):
    array = np.asarray(array, np.uint8)
    header = bytes([0, 0, 0x08, array.ndim])
    header += b"".join(int(d).to_bytes(4, "big") for d in array.shape)
    return header + array.tobytes()


def write_gz(path, raw):
    path.parent.mkdir(parents=True, exist_ok=True)
    with gzip.open(path, "wb") as f:
        f.write(raw)
    return path


@pytest.fixture
def tiny(tmp_path, monkeypatch):
    """A fake dataset 'tiny' of 20 train / 10 test images, registered in DATASETS."""
    rng = np.random.default_rng(0)
    arrays = {"train": (rng.integers(0, 256, (20, 28, 28)), np.arange(20) % 10),
              "test": (rng.integers(0, 256, (10, 28, 28)), np.arange(10) % 10)}
    raw, sums = {}, {}
    for split, (images, labels) in FILES.items():
        for name, arr in ((images, arrays[split][0]), (labels, arrays[split][1])):
            raw[name] = idx_bytes(arr)
            sums[name] = hashlib.sha256(raw[name]).hexdigest()
    source = tmp_path / "source"
    for name, content in raw.items():
        write_gz(source / name, content)
    monkeypatch.setitem(dm.DATASETS, "tiny", {"mirrors": [], "debian": str(tmp_path / "debian"),
                                              "sha256": sums})
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv(dm.DATA_ENV, raising=False)
    dm._load_cached.cache_clear()
    return {"source": source, "raw": raw, "arrays": arrays, "tmp": tmp_path}


def copy_to(tiny, folder):
    for name, content in tiny["raw"].items():
        write_gz(folder / name, content)
    return folder


def test_parse_valid_file(tiny):
    X = dm.read_idx_gz(tiny["source"] / FILES["train"][0])
    assert X.shape == (20, 28, 28) and X.dtype == np.uint8
    np.testing.assert_array_equal(X, tiny["arrays"]["train"][0])


@pytest.mark.parametrize("damage,message", [
    (lambda raw: raw[:-7], "truncated or damaged"),
    (lambda raw: b"\x00\x00\x09\x03" + raw[4:], "bad magic number"),
    (lambda raw: raw[:3] + b"\x02" + raw[4:], "2 dimensions"),
    (lambda raw: raw[:2], "bad magic"),
])
def test_damaged_idx_content_is_refused(tiny, damage, message):
    path = write_gz(tiny["tmp"] / "bad" / "x.gz", damage(tiny["raw"][FILES["train"][0]]))
    with pytest.raises(d2l.DataError, match=message) as e:
        dm.read_idx_gz(path)
    assert str(path) in str(e.value)


def test_checksum_mismatch_names_file(tiny):
    path = tiny["source"] / FILES["train"][1]
    with pytest.raises(d2l.DataError, match="checksum mismatch") as e:
        dm.read_idx_gz(path, "0" * 64)
    assert str(path) in str(e.value)


def test_a_bad_magic_number_is_named_before_the_checksum(tiny):
    path = write_gz(tiny["tmp"] / "bad" / "x.gz", b"\x00\x00\x09\x03" + bytes(20))
    with pytest.raises(d2l.DataError, match="bad magic number"):
        dm.read_idx_gz(path, "0" * 64)


def test_a_file_of_another_data_set_is_named(tmp_path):
    """MNIST's labels in the Fashion-MNIST folder: named as such, not only 'checksum
    mismatch'."""
    name = "train-labels-idx1-ubyte.gz"
    sample = dm.sample_dir("mnist") / name
    expected = dm.SAMPLE_SHA256["fashion-mnist"][name]
    with pytest.raises(d2l.DataError, match=rf"this is mnist's {name}, not the file expected "
                                            rf"here"):
        dm.read_idx_gz(sample, expected)


def test_truncated_gzip_is_refused(tiny):
    good = (tiny["source"] / FILES["train"][0]).read_bytes()
    path = tiny["tmp"] / "cut.gz"
    path.write_bytes(good[: len(good) // 2])
    with pytest.raises(d2l.DataError, match="cannot decompress") as e:
        dm.read_idx_gz(path)
    assert str(path) in str(e.value)


def test_lookup_order(tiny, monkeypatch):
    tmp = tiny["tmp"]
    debian = copy_to(tiny, tmp / "debian")
    assert dm.dataset_dir("tiny") == debian
    cache = copy_to(tiny, tmp / "cache" / "d2l_multi" / "tiny")
    assert dm.dataset_dir("tiny") == cache
    env_root = tmp / "env"
    copy_to(tiny, env_root / "tiny")
    monkeypatch.setenv(dm.DATA_ENV, str(env_root))
    assert dm.dataset_dir("tiny") == env_root / "tiny"
    explicit = copy_to(tiny, tmp / "explicit")  # the files directly in data_dir also work
    assert dm.dataset_dir("tiny", data_dir=explicit) == explicit


def test_damaged_local_copy_is_refused_not_loaded(tiny):
    folder = copy_to(tiny, tiny["tmp"] / "local")
    write_gz(folder / FILES["test"][1], idx_bytes(np.zeros(10)))  # wrong labels
    with pytest.raises(d2l.DataError, match="checksum mismatch"):
        dm.load_dataset("tiny", data_dir=folder)


def test_download_from_mirror_is_atomic_and_verified(tiny, monkeypatch):
    monkeypatch.setitem(dm.DATASETS["tiny"], "mirrors",
                        ["file:///nonexistent/mirror/", tiny["source"].as_uri() + "/"])
    out = dm.load_dataset("tiny")
    np.testing.assert_array_equal(out["test"][1], tiny["arrays"]["test"][1])
    cache = tiny["tmp"] / "cache" / "d2l_multi" / "tiny"
    assert sorted(p.name for p in cache.iterdir()) == sorted(tiny["raw"])  # no *.part left


def test_corrupt_download_leaves_nothing_behind(tiny, monkeypatch):
    bad = tiny["tmp"] / "badmirror"
    for name, content in tiny["raw"].items():
        write_gz(bad / name, content[:-10])  # every file truncated in transit
    monkeypatch.setitem(dm.DATASETS["tiny"], "mirrors", [bad.as_uri() + "/"])
    with pytest.raises(d2l.DataError, match="Provide the data in one of three ways"):
        dm.load_dataset("tiny")
    cache = tiny["tmp"] / "cache" / "d2l_multi" / "tiny"
    assert not cache.exists() or list(cache.iterdir()) == []


def test_offline_error_lists_three_ways(tiny, monkeypatch):
    monkeypatch.setitem(dm.DATASETS["tiny"], "mirrors", ["file:///nonexistent/"])
    with pytest.raises(d2l.DataError) as e:
        dm.load_dataset("tiny")
    text = str(e.value)
    assert "data_dir=" in text and dm.DATA_ENV in text and "cache folder" in text
    assert "apt install dataset-fashion-mnist" in text
    with pytest.raises(ValueError, match="unknown dataset"):
        dm.dataset_dir("cifar")


def test_batches_iterate_shuffle_and_drop_last():
    X, y = np.arange(10)[:, None].astype(np.float32), np.arange(10)
    loader = dm.Batches(X, y, 4, shuffle=True)
    assert len(loader) == 3
    first = np.concatenate([b[1] for b in loader])
    second = np.concatenate([b[1] for b in loader])
    assert sorted(first) == list(range(10)) and not np.array_equal(first, second)
    assert [len(b[1]) for b in dm.Batches(X, y, 4, drop_last=True)] == [4, 4]
    assert np.array_equal(np.concatenate([b[1] for b in dm.Batches(X, y, 4)]), y)


def tiny_data(tiny, seed=0):
    tiny_module = type("Tiny", (d2l.FashionMNIST,), {"name": "tiny", "smoke_sizes": (20, 10)})
    return tiny_module(batch_size=4, data_dir=tiny["source"], seed=seed)


def order(loader):
    """The labels of one pass over ``loader``, in the order it serves them."""
    return np.concatenate([yb for _, yb in loader]).tolist()


def test_an_epoch_s_order_is_a_function_of_the_seed_and_the_epoch(tiny):
    """d2l's pattern (one loader, iterated once per epoch) sees a new order every epoch; a
    loader made for epoch k (epoch=k) serves that same order; the seed decides them all."""
    loader = tiny_data(tiny).get_dataloader(train=True)
    orders = [order(loader) for _ in range(3)]
    assert all(sorted(o) == sorted(orders[0]) for o in orders)   # each a permutation
    assert len({tuple(o) for o in orders}) == 3                 # three different orders
    data = tiny_data(tiny)
    assert orders == [order(data.get_dataloader(train=True, epoch=k)) for k in range(3)]
    assert [order(data.get_dataloader(train=True)) for _ in range(3)] == [orders[0]] * 3
    assert orders[0] != order(tiny_data(tiny, seed=1).get_dataloader(train=True))


def test_peeking_at_a_batch_does_not_change_what_training_sees(tiny):
    """A notebook looks at a batch, then trains: the look changes nothing."""
    untouched = tiny_data(tiny).get_dataloader(train=True)
    expected = [order(untouched) for _ in range(2)]
    data = tiny_data(tiny)
    next(iter(data.get_dataloader(train=True)))                  # peek at a batch
    data.train[0][:8]
    [b for _, b in zip(range(3), data.get_dataloader(train=True))]  # three batches
    loader = data.get_dataloader(train=True)
    assert [order(loader) for _ in range(2)] == expected


def test_re_running_a_training_cell_sees_the_same_batches(tiny):
    data = tiny_data(tiny)

    def cell():  # a cell that trains two epochs on the data module of an earlier cell
        loader = data.get_dataloader(train=True, drop_last=True)
        return [order(loader) for _ in range(2)]
    assert cell() == cell()


@pytest.mark.parametrize("kwargs,message", [
    ({"batch_size": 0}, "batch_size must be a positive integer, got 0"),
    ({"batch_size": 2.5}, "batch_size must be a positive integer"),
    ({"resize": (0, 28)}, r"resize=\(0, 28\).*two positive integers"),
    ({"resize": (-5, 28)}, r"resize=\(-5, 28\)"),
    ({"resize": (28,)}, r"resize=\(28,\)"),
    ({"num_train": -10}, r"num_train=-10: pass a number of examples from 1 to 20"),
    ({"num_train": 0}, r"num_train=0"),
    ({"num_train": 21}, r"num_train=21: pass a number of examples from 1 to 20"),
    ({"num_val": 2.0}, r"num_val=2.0"),
    ({"seed": -1}, "seed must be a non-negative integer"),
])
def test_data_module_refuses_bad_arguments(tiny, kwargs, message):
    tiny_module = type("Tiny", (d2l.FashionMNIST,), {"name": "tiny"})
    with pytest.raises(ValueError, match=message):
        tiny_module(**{"batch_size": 4, "data_dir": tiny["source"], **kwargs})


def test_a_training_set_smaller_than_one_batch_is_refused(tiny):
    tiny_module = type("Tiny", (d2l.FashionMNIST,), {"name": "tiny"})
    data = tiny_module(batch_size=64, data_dir=tiny["source"])
    with pytest.raises(ValueError, match=r"training set has 20 examples, fewer than one batch "
                                         r"of 64.*at most 20"):
        data.get_dataloader(train=True, drop_last=True)
    with pytest.raises(ValueError, match="batch_size must be a positive integer, got -3"):
        data.get_dataloader(train=False, batch_size=-3)


def test_smoke_switch_shrinks_the_data(tiny, monkeypatch):
    tiny_module = type("Tiny", (d2l.FashionMNIST,), {"name": "tiny", "smoke_sizes": (8, 4)})
    monkeypatch.setenv(SMOKE_ENV, "1")
    data = tiny_module(batch_size=4, data_dir=tiny["source"])
    assert len(data.train[0]) == 8 and len(data.val[0]) == 4
    assert len(tiny_module(4, data_dir=tiny["source"], num_train=5).train[0]) == 5
    monkeypatch.setenv(SMOKE_ENV, "0")
    data = tiny_module(batch_size=4, data_dir=tiny["source"])
    assert len(data.train[0]) == 20 and len(data.val[0]) == 10


real = pytest.mark.needs_full_data


@real
def test_real_fashion_mnist(monkeypatch):
    monkeypatch.delenv(SMOKE_ENV, raising=False)  # all the data
    data = d2l.FashionMNIST(batch_size=256)
    (X, y), (Xt, yt) = data.train, data.val
    assert X.shape == (60000, 28, 28, 1) and Xt.shape == (10000, 28, 28, 1)
    assert X.dtype == np.float32 and y.dtype == np.int32
    assert X.min() == 0.0 and X.max() == 1.0
    assert (np.bincount(y) == 6000).all() and (np.bincount(yt) == 1000).all()
    Xb, yb = next(iter(data.get_dataloader(train=True)))
    assert Xb.shape == (256, 28, 28, 1) and yb.shape == (256,)
    assert len(data.get_dataloader(False)) == 40
    assert data.text_labels([0, 9]) == ["t-shirt", "ankle boot"]
    small = d2l.FashionMNIST(32, num_train=100, num_val=50, resize=(32, 32))
    assert small.train[0].shape == (100, 32, 32, 1) and small.val[0].shape == (50, 32, 32, 1)


@real
def test_real_mnist_and_d2l_style_api(monkeypatch):
    monkeypatch.delenv(SMOKE_ENV, raising=False)  # all the data
    mnist = MNIST(batch_size=128)
    assert mnist.train[0].shape == (60000, 28, 28, 1) and mnist.text_labels([3]) == ["3"]
    train_iter, test_iter = d2l.load_data_fashion_mnist(1000)
    assert sum(len(yb) for _, yb in test_iter) == 10000
    assert sum(len(yb) for _, yb in test_iter) == 10000  # re-iterable, as d2l's loaders
    assert len(train_iter) == 60
    axes = d2l.FashionMNIST(16, num_train=16, num_val=16).visualize(
        next(iter(mnist.get_dataloader(False))), nrows=2, ncols=4)
    assert len(axes) == 8


@pytest.fixture
def no_full_copy(tmp_path, monkeypatch):
    """No full copy anywhere: no D2L_MULTI_DATA, an empty cache, Debian's folder hidden."""
    monkeypatch.delenv(dm.DATA_ENV, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for spec in dm.DATASETS.values():
        monkeypatch.setitem(spec, "debian", None)
    dm._load_cached.cache_clear()
    yield
    dm._load_cached.cache_clear()


@pytest.mark.parametrize("cls", [d2l.FashionMNIST, MNIST])
def test_smoke_runs_use_the_shipped_sample_without_a_full_copy(cls, no_full_copy, monkeypatch):
    monkeypatch.setenv(SMOKE_ENV, "1")
    assert dm.dataset_dir(cls.name) == dm.sample_dir(cls.name)
    data = cls(batch_size=64, num_train=8192)  # asks for more: the smoke switch keeps 2048
    assert data.train[0].shape == (2048, 28, 28, 1) and data.val[0].shape == (512, 28, 28, 1)
    assert sorted(np.unique(data.train[1])) == list(range(10))
    with pytest.raises(ValueError, match="num_train=70000: pass a number of examples from 1 "
                                         "to 60000"):
        cls(batch_size=64, num_train=70000)   # checked against the full data set


def test_full_runs_never_use_the_sample(no_full_copy, monkeypatch):
    monkeypatch.delenv(SMOKE_ENV, raising=False)
    with pytest.raises(dm.DataError, match="Provide the data in one of three ways"):
        dm.dataset_dir("fashion-mnist", progress=False)   # the download is refused offline


def test_a_damaged_sample_is_refused(no_full_copy, monkeypatch, tmp_path):
    damaged = tmp_path / "sample" / "fashion-mnist"
    damaged.mkdir(parents=True)
    for f in dm.sample_dir("fashion-mnist").iterdir():
        (damaged / f.name).write_bytes(f.read_bytes())
    name = "t10k-labels-idx1-ubyte.gz"
    (damaged / name).write_bytes(gzip.compress(b"\0\0\x08\x01\0\0\x02\0" + bytes(512)))
    monkeypatch.setattr(dm, "sample_dir", lambda _: damaged)
    monkeypatch.setenv(SMOKE_ENV, "1")
    with pytest.raises(dm.DataError, match=f"{name}: checksum mismatch"):
        d2l.FashionMNIST(64)


@real
@pytest.mark.parametrize("name", ["fashion-mnist", "mnist"])
def test_the_sample_is_the_first_examples_of_the_full_data(name):
    full = dm.load_dataset(name)
    sample = dm._load_cached(name, str(dm.sample_dir(name)))
    for split, n in dm.SAMPLE_SIZES.items():
        for f, s in zip(full[split], sample[split]):
            np.testing.assert_array_equal(f[:n], s)
