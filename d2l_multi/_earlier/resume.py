"""What the ``#@save`` code of ``d2l_multi.resume`` calls as ``d2l.NAME``:
functions of earlier notebooks, imported from where they are defined (written by tools/api.py)."""
from ..checkpoint import save_checkpoint, wait_for_saves

__all__ = ["save_checkpoint", "wait_for_saves"]
