"""What the ``#@save`` code of ``d2l_multi.flax_models`` (notebook 05a) calls as ``d2l.NAME``:
the functions of earlier notebooks, imported from where they are defined."""
from ..hardware import describe
from ..plot import Animator
from ..utils import Accumulator, Timer

__all__ = ["Accumulator", "Animator", "Timer", "describe"]
