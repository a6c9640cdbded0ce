"""What the ``#@save`` code of ``d2l_multi.concise`` (notebook 04a and 04b) calls as ``d2l.NAME``:
the functions of earlier notebooks, imported from where they are defined."""
from ..models import loss_fn

__all__ = ["loss_fn"]
