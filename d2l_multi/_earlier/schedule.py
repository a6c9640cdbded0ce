"""What the ``#@save`` code of ``d2l_multi.schedule`` (notebook 09e) calls as ``d2l.NAME``:
the functions of earlier notebooks, imported from where they are defined."""
from ..concise import COLLECTIVES

__all__ = ["COLLECTIVES"]
