"""What the ``#@save`` code of ``d2l_multi.stacked_ensemble`` calls as ``d2l.NAME``:
functions of earlier notebooks, imported from where they are defined (written by tools/api.py)."""
from ..ensemble import member_step
from ..flax_models import create_train_state

__all__ = ["create_train_state", "member_step"]
