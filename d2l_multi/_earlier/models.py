"""What the ``#@save`` code of ``d2l_multi.models`` (notebook 01) calls as ``d2l.NAME``:
the functions of earlier notebooks, imported from where they are defined."""
from ..utils import Accumulator

__all__ = ["Accumulator"]
