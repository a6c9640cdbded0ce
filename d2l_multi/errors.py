"""The package's own errors: each message names the value or the file and how to fix it.

The commands (``python -m d2l_multi ...``) print these as one line and exit with status 2 for
a bad argument or value (``InputError``) and 1 for the others; any other exception is a bug
and shows its traceback.
"""


class Error(Exception):
    """An error of d2l_multi's own: bad input, or data, a checkpoint or a run it cannot use."""


class InputError(Error, ValueError, TypeError):
    """A value the package refuses: an argument, a label, a size, a setting (a ValueError,
    and a TypeError for a value of the wrong kind)."""


class DataError(Error, RuntimeError):
    """A data set that is missing, damaged or not what its name says."""


class CheckpointError(Error, RuntimeError):
    """A checkpoint that exists but cannot be read: damaged, or not written by Orbax."""


class DivergedError(Error, FloatingPointError):
    """Training produced a loss or parameters that are not finite numbers."""


class TooLargeError(Error, MemoryError):
    """Something asked for more memory than the machine or the devices have."""


class PathError(Error, OSError):
    """A file or folder that cannot be read or written as asked."""


class NotFoundError(PathError, FileNotFoundError):
    """A file or folder that should exist and does not."""


class NotAFolderError(PathError, NotADirectoryError):
    """A path that should be a folder and is a file."""


class AlreadyExistsError(PathError, FileExistsError):
    """A path that holds something the command will not overwrite."""


class NoAccessError(PathError, PermissionError):
    """A file or folder this process may not read or write."""
