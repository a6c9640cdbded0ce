"""What the ``#@save`` code of ``d2l_multi.strategies`` (notebook 09c) calls as ``d2l.NAME``:
the functions of earlier notebooks, imported from where they are defined."""
from ..sharding import use_sharding
from ..transformer import lm_loss

__all__ = ["lm_loss", "use_sharding"]
