"""What the ``#@save`` code of ``d2l_multi.strategies`` calls as ``d2l.NAME``:
functions of earlier notebooks, imported from where they are defined (written by tools/api.py)."""
from ..sharding import use_sharding
from ..transformer import lm_loss

__all__ = ["lm_loss", "use_sharding"]
