"""What the ``#@save`` code of ``d2l_multi.models`` calls as ``d2l.NAME``:
functions of earlier notebooks, imported from where they are defined (written by tools/api.py)."""
from ..utils import Accumulator

__all__ = ["Accumulator"]
