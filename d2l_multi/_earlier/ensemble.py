"""What the ``#@save`` code of ``d2l_multi.ensemble`` (notebook 08) calls as ``d2l.NAME``:
the functions of earlier notebooks, imported from where they are defined."""
from ..flax_models import create_train_state, cross_entropy_loss

__all__ = ["create_train_state", "cross_entropy_loss"]
