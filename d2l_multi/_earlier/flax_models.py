"""What the ``#@save`` code of ``d2l_multi.flax_models`` calls as ``d2l.NAME``:
functions of earlier notebooks, imported from where they are defined (written by tools/api.py)."""
from ..hardware import describe
from ..plot import Animator
from ..utils import Accumulator, Timer

__all__ = ["Accumulator", "Animator", "Timer", "describe"]
