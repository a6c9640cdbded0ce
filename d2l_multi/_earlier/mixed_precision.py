"""What the ``#@save`` code of ``d2l_multi.mixed_precision`` (notebook 07c) calls as ``d2l.NAME``:
the functions of earlier notebooks, imported from where they are defined."""
from ..concise import make_train_step
from ..models import lenet

__all__ = ["lenet", "make_train_step"]
