"""Command line: ``python -m d2l_multi {train,benchmark,launch,book} ...``.

``train`` (the default) runs the chapter's headline experiment: LeNet on Fashion-MNIST, data
parallel on 1 and on N devices, with a table and two PNG plots. ``book`` builds the chapter as
an HTML book in ``_build/html``.
"""
import sys


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    command = argv.pop(0) if argv and not argv[0].startswith("-") else "train"
    if command == "train":
        from .cli import train_main
        return train_main(argv)
    if command == "benchmark":
        from .benchmark import main as benchmark_main
        return benchmark_main(argv)
    if command == "launch":
        from .launch import main as launch_main
        return launch_main(argv)
    if command == "book":
        from .book import main as book_main
        return book_main(argv)
    print(f"unknown command {command!r}; use one of: train, benchmark, launch, book "
          f"(python -m d2l_multi COMMAND --help)", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
