"""What the ``#@save`` code of ``d2l_multi.cost_model`` (notebook 07a) calls as ``d2l.NAME``:
the functions of earlier notebooks, imported from where they are defined."""
from ..utils import time_call

__all__ = ["time_call"]
