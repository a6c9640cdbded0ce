"""What the ``#@save`` code of ``d2l_multi.mixed_precision`` calls as ``d2l.NAME``:
functions of earlier notebooks, imported from where they are defined (written by tools/api.py)."""
from ..hlo import collective_ops, HLO_BYTES
from ..models import lenet

__all__ = ["HLO_BYTES", "collective_ops", "lenet"]
