"""What the ``#@save`` code of ``d2l_multi.cost_model`` calls as ``d2l.NAME``:
functions of earlier notebooks, imported from where they are defined (written by tools/api.py)."""
from ..utils import time_call

__all__ = ["time_call"]
