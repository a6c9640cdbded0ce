"""What the ``#@save`` code of ``d2l_multi.concise`` calls as ``d2l.NAME``:
functions of earlier notebooks, imported from where they are defined (written by tools/api.py)."""
from ..hlo import collective_ops
from ..models import loss_fn

__all__ = ["collective_ops", "loss_fn"]
