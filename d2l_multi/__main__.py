"""Command line: ``python -m d2l_multi {train,benchmark,launch,book,classroom} ...``.

``train`` (the default) runs the chapter's headline experiment: LeNet on Fashion-MNIST, data
parallel on 1 and on N devices, with a table and two PNG plots; ``book`` builds the chapter as
an HTML book in ``_build/html``; ``classroom`` makes the student edition and grades
submissions (docs/classroom.md). Expected errors (bad
arguments, missing data, a damaged checkpoint, a diverging run) print one message and exit
non-zero; set ``D2L_MULTI_TRACEBACK=1`` to see the traceback as well.
"""
import os
import sys

COMMANDS = {  # name: (module, function, what it does)
    "train": ("cli", "train_main", "LeNet data parallel on 1 and N devices: a table and two "
                                   "plots (the default command)"),
    "benchmark": ("benchmark", "main", "where an epoch's time goes; 'benchmark models' times "
                                       "LeNet's and ResNet-18's steps"),
    "launch": ("launch", "main", "run a command as K cooperating JAX processes on this "
                                 "machine"),
    "book": ("book", "main", "build the chapter as an HTML book"),
    "classroom": ("classroom", "main", "build the student edition; grade a folder of "
                                       "submitted notebooks"),
}
TRACEBACK_ENV = "D2L_MULTI_TRACEBACK"


def expected_errors():
    """The exceptions that report a problem with the input or the environment, not a bug."""
    from .data import DataError
    errors = (DataError, ValueError, FloatingPointError, OSError, MemoryError)
    if "d2l_multi.checkpoint" in sys.modules:  # loaded only by commands that use Orbax
        errors += (sys.modules["d2l_multi.checkpoint"].CheckpointError,)
    return errors


def run(prog, function, argv):
    """Call ``function(argv)``; print expected errors as one line and return 1 (2 for
    ValueError, a bad argument)."""
    try:
        return function(argv)
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        return 130
    except expected_errors() as e:
        if os.environ.get(TRACEBACK_ENV):
            raise
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2 if isinstance(e, ValueError) else 1


def usage():
    """The list of commands that ``python -m d2l_multi --help`` prints."""
    rows = "".join(f"  {name:<10} {what}\n" for name, (_, _, what) in COMMANDS.items())
    return (f"usage: python -m d2l_multi [COMMAND] [options]\n\ncommands:\n{rows}\n"
            f"python -m d2l_multi COMMAND --help shows a command's options.")


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["-h"], ["--help"]):
        print(usage())
        return 0
    command = argv.pop(0) if argv and not argv[0].startswith("-") else "train"
    if command not in COMMANDS:
        print(f"unknown command {command!r}; use one of: {', '.join(COMMANDS)} "
              f"(python -m d2l_multi COMMAND --help)", file=sys.stderr)
        return 2
    import importlib
    module, name, _ = COMMANDS[command]
    function = getattr(importlib.import_module(f".{module}", __package__), name)
    return run(f"python -m d2l_multi {command}", function, argv)


if __name__ == "__main__":
    sys.exit(main())
