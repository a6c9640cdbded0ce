"""Write the sample data shipped in d2l_multi/sample_data/ from the original IDX files.

The sample is the first 2048 training and the first 512 test examples of Fashion-MNIST and of
MNIST, in the original IDX format, gzip-compressed without a timestamp (so the files are
byte-for-byte reproducible). These are the examples every run with the smoke switch on uses,
so a quick run gives the same numbers with or without the full data.

    python tools/make_sample_data.py /path/to/data   # a folder holding fashion-mnist/, mnist/

The originals are verified against the sha256 sums in d2l_multi/data.py first.
"""
import gzip
import hashlib
import pathlib
import sys

from d2l_multi import data


def idx_bytes(array):
    header = bytes([0, 0, 0x08, array.ndim]) + b"".join(
        int(s).to_bytes(4, "big") for s in array.shape)
    return header + array.tobytes()


def main(source):
    out_root = pathlib.Path(data.__file__).parent / "sample_data"
    for name in data.DATASETS:
        full = data.load_dataset(name, data_dir=source)
        out = out_root / name
        out.mkdir(parents=True, exist_ok=True)
        for split, files in data._SPLITS.items():
            X, y = full[split]
            size = data.SAMPLE_SIZES[split]
            for fname, array in zip(files, (X[:size], y[:size])):
                raw = idx_bytes(array)
                with open(out / fname, "wb") as f:
                    f.write(gzip.compress(raw, compresslevel=9, mtime=0))
                print(f"{name}/{fname}: {array.shape} sha256 {hashlib.sha256(raw).hexdigest()}")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else None)
