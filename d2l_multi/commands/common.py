"""What the commands share: one-line argument errors, argument types, safe output files:
an output folder is checked (a folder, writable, room for what the run writes, no folder where
a file goes) before any long work, held by one run at a time, and every write names its
path."""
import argparse
import contextlib
import fcntl
import math
import os
import pathlib
import secrets
import shutil
import tempfile
from collections.abc import Callable, Iterable, Iterator

from ..errors import AlreadyExistsError, NoAccessError, NotAFolderError, PathError


class InUseError(PathError, BlockingIOError):
    """A folder another run is using."""


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
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if not math.isfinite(value) or value <= 0:
            raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
        return value
    return parse


def path_argument(text: str) -> pathlib.Path:
    """An argparse type: a path, never empty (``Path('')`` would be the current folder) and
    without a NUL character."""
    if not text.strip() or "\0" in text:
        raise argparse.ArgumentTypeError(f"expected a path, got {text!r}")
    return pathlib.Path(text)


def check_out(out: pathlib.Path, files: Iterable[str] = (), need: int = 0,
              option: str = "--out") -> None:
    """Refuse the output folder ``out`` before any long work: a file, a folder this process
    cannot write (or create), one of the ``files`` the run writes there being a folder, or a
    disk with fewer than ``need`` bytes free. Creates nothing (a probe file comes and goes
    in the nearest folder that exists)."""
    out = pathlib.Path(out)
    existing = next(p for p in [out, *out.absolute().parents] if p.exists())
    if not existing.is_dir():
        where = "" if existing == out else f": {existing} is a file"
        raise NotAFolderError(f"{option} {out}{where or ' is a file'}, not a folder; pass a "
                              f"folder")
    try:
        tempfile.TemporaryFile(dir=existing).close()
    except OSError as e:
        raise NoAccessError(f"cannot write into {option} {out} ({existing}: {e.strerror}); "
                            f"pass a folder you can write to") from None
    for name in files:
        if (out / name).is_dir():
            raise AlreadyExistsError(f"{out / name} is a folder, where the run writes its "
                                     f"file {name}; move it away, or pass another {option}")
    free = shutil.disk_usage(existing).free
    if free < need:
        raise PathError(f"{option} {out}: its disk has {free:,} bytes free, but the run writes "
                        f"about {need:,}; free some space, or pass a folder on another disk")


def writable_dir(path, option="--out"):
    """Create ``path`` if needed after checking it (``check_out``); returns it."""
    path = pathlib.Path(path)
    check_out(path, option=option)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise NoAccessError(f"cannot create {option} {path} ({e.strerror}); pass a folder "
                            f"you can write to") from None
    return path


@contextlib.contextmanager
def only_run(out: pathlib.Path, option: str = "--out") -> Iterator[None]:
    """Hold ``OUT/.lock`` for the whole run: a second run on the same folder is refused at
    once instead of replacing this run's files."""
    writable_dir(out, option)
    with open(pathlib.Path(out) / ".lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InUseError(f"{option} {out} is in use by another run; wait until it ends, "
                             f"or pass another {option}") from None
        yield


def save_atomic(path: pathlib.Path, write: Callable[[pathlib.Path], object]) -> pathlib.Path:
    """Call ``write(tmp)`` with a temporary file next to ``path``, then rename it to ``path``:
    the file is either complete or absent. It gets a new file's mode (the umask applies).
    A failure is a PathError naming ``path``."""
    path = pathlib.Path(path)
    tmp = path.parent / f".{path.name}.{secrets.token_hex(8)}{path.suffix}"
    try:
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        write(tmp)
        os.replace(tmp, path)
    except OSError as e:
        free = shutil.disk_usage(path.parent).free if path.parent.is_dir() else 0
        raise PathError(f"cannot write {path} ({e.strerror or e}; its disk has {free:,} bytes "
                        f"free); free some space, or pass another --out") from None
    finally:
        if os.path.exists(tmp):
            os.remove(tmp)
    return path


def describe_machine() -> str:
    """One line naming this machine: CPU model, cores, load average and OS (starts no JAX)."""
    import platform

    from ..hardware import cpu_model
    cpu = cpu_model()
    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    return (f"{cpu}, {os.cpu_count()} cores, load average {load}, "
            f"{platform.system()} {platform.release()}")
