"""The chapter's command-line programs: ``python -m d2l_multi [--version] COMMAND [options]``.

Each command is a module of this package with ``HELP`` (one line), ``DESCRIPTION``,
``configure(parser)`` (its arguments) and ``run(args)`` (the program; it returns the exit
status). They import the library; the library never imports them. ``train`` is the default
command. The package's own errors (``d2l_multi.errors.Error``: a bad argument, missing data, a
damaged checkpoint, a diverging run) print one line and exit with status 2 for a bad argument
or value, 1 for the others (``D2L_MULTI_TRACEBACK=1`` shows their traceback too); any other
exception is a bug and shows its traceback.
"""
import argparse
import importlib
import sys
from collections.abc import Callable, Sequence

from .. import __version__
from .._checks import env_flag
from ..errors import Error, InputError
from ..smoke_switch import smoke
from .common import OneLineParser

COMMANDS = ("train", "benchmark", "launch", "book", "classroom")
DEFAULT = "train"
TRACEBACK_ENV = "D2L_MULTI_TRACEBACK"
_SUMMARIES = {  # shown by `python -m d2l_multi --help` without importing every command
    "train": "LeNet data parallel on 1 and N devices: a table and two plots (the default)",
    "benchmark": "where an epoch's time goes; 'benchmark models' times LeNet and ResNet-18",
    "launch": "run a command as K cooperating JAX processes on this machine",
    "book": "build the chapter as an HTML book",
    "classroom": "the student edition, an nbgrader course, grading of submissions",
}


def parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``python -m d2l_multi``, with ``command``'s arguments configured (only
    that command's module is imported)."""
    top = OneLineParser(prog="python -m d2l_multi",
                        formatter_class=lambda prog: argparse.HelpFormatter(
                            prog, max_help_position=20),
                        description="The command-line programs of the chapter 'Training on "
                                    "multiple devices with JAX'.",
                        epilog="python -m d2l_multi COMMAND --help shows a command's options.")
    top.add_argument("--version", action="version", version=f"d2l-multi {__version__}")
    sub = top.add_subparsers(dest="program", metavar="COMMAND", title="commands")
    for name in COMMANDS:
        if name != command:
            sub.add_parser(name, help=_SUMMARIES[name])
            continue
        module = importlib.import_module(f".{name}", __name__)
        p = sub.add_parser(name, help=module.HELP, description=module.DESCRIPTION)
        module.configure(p)
        p.set_defaults(run=getattr(module, "run_command", module.run))
    return top


def run(prog: str, function: Callable[..., int], *args: object) -> int:
    """``function(*args)``; the package's own errors become one line and exit status 2 (a bad
    argument or value) or 1, Ctrl-C becomes 130; other exceptions propagate. The switches
    ``D2L_MULTI_TRACEBACK`` and ``D2L_MULTI_SMOKE`` are read first, strictly."""
    show = False
    try:
        show = env_flag(TRACEBACK_ENV)
        smoke()
        return function(*args)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except Error as e:
        if show:
            raise
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, InputError) else 1


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` (default: the command line) and run the command; its exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or (argv[0].startswith("-") and argv[0] not in ("-h", "--help", "--version")):
        argv.insert(0, DEFAULT)
    command, rest = argv[0], None
    if command in COMMANDS:  # a command with subcommands may have a default one
        module = importlib.import_module(f".{command}", __name__)
        default = getattr(module, "DEFAULT_SUBCOMMAND", None)
        if default and (len(argv) == 1 or argv[1].startswith("-")) and \
                argv[1:2] != ["-h"] and argv[1:2] != ["--help"]:
            argv.insert(1, default)
    if command == "launch":  # the launched COMMAND and its options are not the launcher's
        from .launch import split_command
        options, rest = split_command(argv[1:])
        argv = [command, *options]
    try:
        args = parser(command).parse_args(argv)
    except SystemExit as e:  # --help, --version, or a one-line argument error
        return e.code if isinstance(e.code, int) else 0 if e.code is None else 2
    if args.program is None:
        parser().print_help()
        return 2
    if rest is not None:
        args.command = rest
    return run(f"python -m d2l_multi {command}", args.run, args)
