"""Fashion-MNIST and MNIST from the original IDX files, found locally or downloaded.

Lookup order for each dataset: ``data_dir`` argument → ``$D2L_MULTI_DATA/<name>/`` → the user
cache (``$XDG_CACHE_HOME/d2l_multi/<name>/``) → Debian's ``/usr/share/datasets/<name>/``
(package ``dataset-fashion-mnist``) → with the smoke switch on, the sample shipped in
``d2l_multi/sample_data/`` (the first 2048 training and 512 test examples, which are all a
smoke run uses) → download from the canonical mirrors into ``data_dir`` or the cache. Every
file is checked against the sha256 of its *decompressed* content, so a re-gzipped copy
(Debian's) is accepted and a damaged one is refused with the file's name.
"""
import functools
import gzip
import hashlib
import os
import pathlib
import tempfile
import urllib.request
import zlib
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from . import _checks as check
from .errors import DataError, InputError, PathError

DATA_ENV = "D2L_MULTI_DATA"
_SPLITS = {"train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
           "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz")}

DATASETS = {
    "fashion-mnist": {
        "mirrors": ["http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
                    "https://github.com/zalandoresearch/fashion-mnist/raw/master/data/fashion/"],
        "debian": "/usr/share/datasets/fashion-mnist",
        "sizes": {"train": 60_000, "test": 10_000},
        "sha256": {  # of the decompressed IDX content
            "train-images-idx3-ubyte.gz": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",  # noqa: E501
            "train-labels-idx1-ubyte.gz": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",  # noqa: E501
            "t10k-images-idx3-ubyte.gz": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",  # noqa: E501
            "t10k-labels-idx1-ubyte.gz": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",  # noqa: E501
        },
    },
    "mnist": {
        "mirrors": ["https://ossci-datasets.s3.amazonaws.com/mnist/",
                    "https://storage.googleapis.com/cvdf-datasets/mnist/"],
        "debian": None,
        "sizes": {"train": 60_000, "test": 10_000},
        "sha256": {
            "train-images-idx3-ubyte.gz": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",  # noqa: E501
            "train-labels-idx1-ubyte.gz": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",  # noqa: E501
            "t10k-images-idx3-ubyte.gz": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",  # noqa: E501
            "t10k-labels-idx1-ubyte.gz": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",  # noqa: E501
        },
    },
}


SAMPLE_SIZES = {"train": 2048, "test": 512}  # the first examples of each split
SAMPLE_SHA256 = {  # of the decompressed sample files (tools/make_sample_data.py)
    "fashion-mnist": {
        "train-images-idx3-ubyte.gz": "2638b79e52ead7bacad88c1a913b089757871a8eec13fd966dfedf9c2d881aaf",  # noqa: E501
        "train-labels-idx1-ubyte.gz": "77c8ce66aefe27d97ef7cc1eaa60291ed962a405a8f717dd95487b98aa903e57",  # noqa: E501
        "t10k-images-idx3-ubyte.gz": "d2223cd325784a5e01e09112cd7f626cfc3c78e2f26b81e1c3ac5152ced7be9f",  # noqa: E501
        "t10k-labels-idx1-ubyte.gz": "673e491a4e3bc9ee3e19141f2f57173a1a1707a7d15ffac6adbbe7f985e2264e",  # noqa: E501
    },
    "mnist": {
        "train-images-idx3-ubyte.gz": "a66944ab7c77489e7a3a6cc1fe66bc3084e11a11141237ed7537a3f1b2072f98",  # noqa: E501
        "train-labels-idx1-ubyte.gz": "fdb8efb936f647a73024ce5e7c29b44e2048ff885293a84dfba7d09393708037",  # noqa: E501
        "t10k-images-idx3-ubyte.gz": "9d573bf61bb651469c2e01ffc42d32220e2eed3c8991e7148223c2a05698ae86",  # noqa: E501
        "t10k-labels-idx1-ubyte.gz": "2e5d96fa21a97a70e391239479319e3587978aa81a855c2a879c31d76768bcec",  # noqa: E501
    },
}


_KNOWN = {sha: (name, f) for name, spec in DATASETS.items() for f, sha in spec["sha256"].items()}
_KNOWN |= {sha: (name, f) for name, sums in SAMPLE_SHA256.items() for f, sha in sums.items()}
LARGEST_IDX = 16 + 60_000 * 28 * 28  # bytes of the largest file (training images)


def cache_dir():
    """The user cache folder for downloads (``$XDG_CACHE_HOME/d2l_multi`` or ``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return pathlib.Path(base) / "d2l_multi"


def parse_idx(raw, name="<bytes>", expected_sha256=None):
    """Parse decompressed IDX bytes into a uint8 array, checking magic, size and hash (a
    known file in the wrong place is named)."""
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DataError(f"{name}: not an unsigned-byte IDX file (bad magic number "
                        f"{raw[:4].hex() or 'empty'}; expected 000008xx)")
    ndim = raw[3]
    if ndim not in (1, 3):
        raise DataError(f"{name}: IDX file has {ndim} dimensions; images need 3, labels 1")
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DataError(f"{name}: truncated IDX header ({len(raw)} bytes)")
    shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
    expected = header + int(np.prod(shape))
    if len(raw) != expected:
        raise DataError(f"{name}: {len(raw)} bytes but shape {shape} needs {expected}; "
                        f"the file is truncated or damaged")
    got = hashlib.sha256(raw).hexdigest()
    if expected_sha256 is not None and got != expected_sha256:
        if got in _KNOWN and _KNOWN[got] != _KNOWN.get(expected_sha256):
            raise DataError(f"{name}: this is {_KNOWN[got][0]}'s {_KNOWN[got][1]}, not the "
                            f"file expected here; keep each data set's files in a folder of "
                            f"its name (fashion-mnist/, mnist/)")
        raise DataError(f"{name}: checksum mismatch (sha256 {got}, expected "
                        f"{expected_sha256}); the file is damaged or not the original. "
                        f"Delete it and load again to re-download.")
    return np.frombuffer(raw, np.uint8, offset=header).reshape(shape)


def read_idx_gz(path, expected_sha256=None, max_bytes=LARGEST_IDX):
    """Read one gzip-compressed IDX file into a uint8 array; decompress at most
    ``max_bytes`` (a file that holds more is refused before it fills the memory)."""
    path = pathlib.Path(path)
    check.regular_files(path, "replace it with the data file, or delete it to download it")
    parts, size = [], 0
    try:
        with gzip.open(path, "rb") as f:
            while size <= max_bytes and (part := f.read(1 << 20)):
                parts.append(part)
                size += len(part)
    except (gzip.BadGzipFile, EOFError, zlib.error) as e:
        raise DataError(f"{path}: cannot decompress ({e}); the file is truncated or "
                        f"damaged. Delete it and load again.") from None
    except OSError as e:
        raise PathError(f"cannot read {path}: {e.strerror or e}") from None
    if size > max_bytes:
        raise DataError(f"{path}: decompresses to more than the {max_bytes:,} bytes the file "
                        f"should hold (a damaged file, or a gzip bomb); delete it and load "
                        f"again")
    return parse_idx(b"".join(parts), str(path), expected_sha256)


def _candidates(name, data_dir):
    spec = DATASETS[name]
    roots = []
    if data_dir is not None:
        roots += [pathlib.Path(data_dir) / name, pathlib.Path(data_dir)]
    env = check.env_folder(DATA_ENV)  # set: a folder that exists
    if env is not None:
        roots.append(env / name)
    roots.append(cache_dir() / name)
    if spec["debian"]:
        roots.append(pathlib.Path(spec["debian"]))
    return roots


def find_dataset(name, data_dir=None):
    """Return the first folder that holds all four files of ``name``, or None."""
    for root in _candidates(name, data_dir):
        if all((root / f).is_file() for f in DATASETS[name]["sha256"]):
            return root
    return None


def download(url, dest, expected_sha256, progress=True):
    """Download ``url`` to ``dest`` atomically, verifying the decompressed sha256."""
    from tqdm.auto import tqdm
    dest = pathlib.Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=dest.name + ".", suffix=".part")
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=30) as resp:
            total = int(resp.headers.get("Content-Length") or 0) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=dest.name,
                      disable=not progress) as bar:
                while chunk := resp.read(1 << 16):
                    out.write(chunk)
                    bar.update(len(chunk))
        read_idx_gz(tmp, expected_sha256)  # refuse anything damaged before it is visible
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return dest


def _download_all(name, dest_root, progress):
    spec, errors = DATASETS[name], []
    for fname, sha in spec["sha256"].items():
        if (dest_root / fname).is_file():
            continue
        for mirror in spec["mirrors"]:
            try:
                download(mirror + fname, dest_root / fname, sha, progress)
                break
            except (OSError, DataError) as e:
                errors.append(f"{mirror + fname}: {e}")
        else:
            raise DataError(
                f"Could not find {name} locally and could not download it:\n  "
                + "\n  ".join(errors) + "\nProvide the data in one of three ways:\n"
                f"  1. pass data_dir='/path/to/folder' holding the four {name} .gz files;\n"
                f"  2. set {DATA_ENV}=/path/to/data, a folder holding {name}/;\n"
                f"  3. copy the files into the cache folder {dest_root}"
                + (" (or on Debian/Ubuntu: sudo apt install dataset-fashion-mnist)"
                   if spec["debian"] else "") + ".")
    return dest_root


def sample_dir(name):
    """The folder of the sample shipped with the package (first 2048 training and 512 test
    examples), or None when there is none for ``name``."""
    root = pathlib.Path(__file__).resolve().parent / "sample_data" / name
    return root if name in SAMPLE_SHA256 and root.is_dir() else None


def dataset_dir(name="fashion-mnist", data_dir=None, download_missing=True, progress=True):
    """Return the folder holding ``name``'s files: a full local copy; with the smoke switch on
    and no full copy, the shipped sample; else a download."""
    if name not in DATASETS:
        raise InputError(f"unknown dataset {name!r}; choose one of {sorted(DATASETS)}")
    if data_dir is not None:
        check.folder_path(data_dir, "data_dir")
    root = find_dataset(name, data_dir)
    if root is not None:
        return root
    from .smoke_switch import smoke
    if smoke() and sample_dir(name) is not None:
        return sample_dir(name)
    dest = pathlib.Path(data_dir) / name if data_dir is not None else cache_dir() / name
    if not download_missing:
        raise DataError(f"{name} not found in any of: "
                        f"{', '.join(map(str, _candidates(name, data_dir)))}")
    return _download_all(name, dest, progress)


@functools.lru_cache(maxsize=4)
def _load_cached(name, root):
    is_sample = pathlib.Path(root) == sample_dir(name)
    sums = SAMPLE_SHA256[name] if is_sample else DATASETS[name]["sha256"]
    sizes = SAMPLE_SIZES if is_sample else DATASETS[name].get("sizes", {})
    out = {}
    for split, (images, labels) in _SPLITS.items():
        n = sizes.get(split)  # unknown: no more than the largest file
        X = read_idx_gz(pathlib.Path(root) / images, sums[images],
                        16 + 28 * 28 * n if n else LARGEST_IDX)
        y = read_idx_gz(pathlib.Path(root) / labels, sums[labels], 8 + n if n else LARGEST_IDX)
        if X.ndim != 3 or y.ndim != 1 or len(X) != len(y):
            raise DataError(f"{root}: {split} images {X.shape} and labels {y.shape} "
                            f"do not match")
        out[split] = (X, y)
    return out


def load_dataset(name="fashion-mnist", data_dir=None):
    """Return ``{'train': (X, y), 'test': (X, y)}`` as uint8 arrays, X of shape (n, 28, 28):
    all the examples, or only the first ones when the shipped sample stands in (smoke switch
    on, no full copy found)."""
    root = dataset_dir(name, data_dir)
    return _load_cached(name, str(root.resolve()))


class Batches:
    """Mini-batches ``(X, y)`` of two arrays. With ``shuffle``, pass ``k`` over this loader
    (counted from ``epoch``) uses the permutation drawn from ``(seed, epoch + k)``: iterating
    one loader once per epoch reshuffles every epoch, and nothing outside the loader (another
    loader, a peek at a batch) changes its order."""

    def __init__(self, X: np.ndarray, y: np.ndarray, batch_size: int, shuffle: bool = False,
                 drop_last: bool = False, seed: int = 0, epoch: int = 0) -> None:
        self.X, self.y, self.batch_size = X, y, batch_size
        self.shuffle, self.drop_last, self.seed, self.epoch = shuffle, drop_last, seed, epoch

    def __len__(self) -> int:
        n, b = len(self.X), self.batch_size
        return n // b if self.drop_last else -(-n // b)

    def __iter__(self) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        n = len(self.X)
        if self.shuffle:
            order = np.random.default_rng((self.seed, self.epoch)).permutation(n)
            self.epoch += 1  # the next pass is the next epoch
        else:
            order = np.arange(n)
        return self._batches(order)

    def _batches(self, order):
        b = self.batch_size
        for i in range(0, len(self) * b, b):
            idx = order[i:i + b]
            yield self.X[idx], self.y[idx]


def _check_count(name, value, available):
    try:
        check.integer(1, available, none=True, **{name: value})
    except InputError:
        raise InputError(f"{name}={value!r}: pass a number of examples from 1 to {available}, "
                         f"or None for all {available}") from None


def _check_resize(resize):
    """``resize`` as (height, width) or None; ``32`` means (32, 32)."""
    if resize is None:
        return None
    size = (resize, resize) if check._number(resize) is not None else tuple(resize)
    if len(size) != 2 or any(not isinstance(check._number(s), int) or s < 1 for s in size):
        raise InputError(f"resize={resize!r}: pass (height, width) as two positive "
                         f"integers, e.g. (28, 28), or None to keep the original size")
    return tuple(int(s) for s in size)


class FashionMNIST:
    """d2l's Fashion-MNIST data module, as NumPy arrays in NHWC layout.

    ``train`` and ``val`` are ``(X, y)`` with X float32 in [0, 1] of shape (n, 28, 28, 1)
    (``resize``: (n, height, width, 1); an int is a square) and y int32. ``num_train`` and
    ``num_val`` keep only the first examples. With the smoke switch on
    (``D2L_MULTI_SMOKE=1``) at most 2048 training and 512 test examples are kept.
    """
    name = "fashion-mnist"
    labels = ["t-shirt", "trouser", "pullover", "dress", "coat",
              "sandal", "shirt", "sneaker", "bag", "ankle boot"]
    smoke_sizes = (SAMPLE_SIZES["train"], SAMPLE_SIZES["test"])  # what the sample holds

    def __init__(self, batch_size: int = 64, resize: int | tuple[int, int] | None = (28, 28),
                 data_dir: str | os.PathLike | None = None, *, num_train: int | None = None,
                 num_val: int | None = None, seed: int = 0) -> None:
        check.positive(batch_size=batch_size)
        self.resize = size = _check_resize(resize)
        check.integer(0, seed=seed)
        raw = load_dataset(self.name, data_dir)
        full = DATASETS[self.name].get("sizes", {})  # the sample may stand in for all of it
        _check_count("num_train", num_train, full.get("train", len(raw["train"][1])))
        _check_count("num_val", num_val, full.get("test", len(raw["test"][1])))
        from .smoke_switch import shrink
        keep = (shrink(num_train, self.smoke_sizes[0]), shrink(num_val, self.smoke_sizes[1]))
        if size is not None:
            n = sum(len(raw[split][1][:k]) for split, k in zip(("train", "test"), keep))
            check.fits(n * size[0] * size[1] * 4, f"resize={resize!r}: {n:,} images of "
                       f"{size[0]} x {size[1]} float32 values", "pass a smaller resize, or "
                       "keep fewer examples (num_train, num_val)")
        self.batch_size, self.seed = batch_size, seed
        self.train = self._prepare(*raw["train"], keep[0])
        self.val = self._prepare(*raw["test"], keep[1])

    def _prepare(self, X, y, n):
        X, y = X[:n], y[:n]
        X = (X.astype(np.float32) / 255.0)[..., None]
        if self.resize is not None and self.resize != X.shape[1:3]:
            import jax
            out = np.empty((len(X), *self.resize, 1), np.float32)
            step = max(1, 2**26 // (self.resize[0] * self.resize[1]))  # 256 MB at a time
            for i in range(0, len(X), step):
                part = X[i:i + step]
                out[i:i + step] = jax.image.resize(part, (len(part), *self.resize, 1),
                                                   "bilinear")
            X = out
        return X, y.astype(np.int32)

    def text_labels(self, indices: Iterable[int]) -> list[str]:
        """Return the text labels of integer class indices."""
        indices = np.ravel(indices) if np.ndim(indices) == 0 else indices  # one index
        check.labels(indices, len(self.labels), "indices")
        return [self.labels[int(i)] for i in indices]

    def get_dataloader(self, train: bool, batch_size: int | None = None, drop_last: bool = False,
                       epoch: int = 0) -> "Batches":
        """Return an iterable of ``(X, y)`` batches. Training batches come in the order of
        ``(seed, epoch)``, and every further pass over the same loader is the next epoch's:
        make the loader once and iterate it once per epoch (or pass ``epoch=k`` to a loader
        made for epoch ``k``). ``drop_last``: skip the last incomplete batch."""
        batch_size = self.batch_size if batch_size is None else batch_size
        check.flag(train=train, drop_last=drop_last)
        check.positive(batch_size=batch_size)
        check.integer(0, epoch=epoch)
        X, y = self.train if train else self.val
        if drop_last and len(X) < batch_size:
            raise InputError(
                f"the {'training' if train else 'test'} set has {len(X)} examples, fewer than "
                f"one batch of {batch_size}, so drop_last=True leaves no batch at all; use a "
                f"batch size of at most {len(X)}, or keep more examples (num_train/num_val)")
        return Batches(X, y, batch_size, shuffle=train, drop_last=drop_last, seed=self.seed,
                       epoch=epoch)

    def train_dataloader(self) -> "Batches":
        return self.get_dataloader(train=True)

    def val_dataloader(self) -> "Batches":
        return self.get_dataloader(train=False)

    def visualize(self, batch: tuple[Any, Any], nrows: int = 1, ncols: int = 8,
                  labels: Sequence[str] = ()) -> Any:
        """Show a grid of images from a batch ``(X, y)`` with their text labels."""
        from .plot import show_images
        X, y = batch
        labels = list(labels) or self.text_labels(y)
        return show_images(X[..., 0], nrows, ncols, titles=labels)


class MNIST(FashionMNIST):
    """The same data module for the original MNIST digits."""
    name = "mnist"
    labels = [str(i) for i in range(10)]


def load_data_fashion_mnist(batch_size: int, resize: int | tuple[int, int] | None = None
                            ) -> tuple["Batches", "Batches"]:
    """d2l's older API: return ``(train_iter, test_iter)`` over Fashion-MNIST."""
    data = FashionMNIST(batch_size, resize=resize)
    return data.get_dataloader(True), data.get_dataloader(False)
