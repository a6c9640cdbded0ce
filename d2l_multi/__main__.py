"""``python -m d2l_multi [--version] COMMAND [options]``: see ``d2l_multi.commands``."""
import sys

from .commands import main

if __name__ == "__main__":
    sys.exit(main())
