"""``python -m d2l_multi.mp_train``: the program ``d2l_multi.commands.mp_train``, by its short
name (as the launcher and cluster scripts start it)."""

if __name__ == "__main__":
    from .commands.mp_train import main
    from .distributed import exit_worker
    exit_worker(main())
