"""What the ``#@save`` code of ``d2l_multi.ensemble`` calls as ``d2l.NAME``:
functions of earlier notebooks, imported from where they are defined (written by tools/api.py)."""
from ..flax_models import create_train_state, cross_entropy_loss

__all__ = ["create_train_state", "cross_entropy_loss"]
