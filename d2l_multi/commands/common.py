"""What the commands share: one-line argument errors, argument types, safe output files."""
import argparse
import math
import os
import pathlib
import secrets
import tempfile
from ..errors import NoAccessError, NotAFolderError


class OneLineParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line that names the fix (no usage block)."""

    def error(self, message):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def positive(kind):
    """An argparse type: a finite number of ``kind`` greater than 0."""
    def parse(text):
        try:
            value = kind(text)
        except ValueError:
            what = "a whole number" if kind is int else "a number"
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}")
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
        return value
    return parse


def writable_dir(path):
    """Create ``path`` if needed and check that files can be written there, or raise
    OSError naming the folder and the fix."""
    path = pathlib.Path(path)
    if path.exists() and not path.is_dir():
        raise NotAFolderError(f"--out {path} is a file, not a folder; pass a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(dir=path, prefix=".write-test")
        os.close(fd)
        os.remove(probe)
    except OSError as e:
        raise NoAccessError(f"cannot write into --out {path} ({e.strerror}); pass a folder "
                            f"you can write to") from None
    return path


def save_atomic(path, write):
    """Call ``write(tmp)`` with a temporary file next to ``path``, then rename it to ``path``:
    the file is either complete or absent. It gets a new file's mode (the umask applies)."""
    path = pathlib.Path(path)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}{path.suffix}"
    os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


