"""What the ``#@save`` code of ``d2l_multi.mixed_precision`` calls as ``d2l.NAME``:
functions of earlier notebooks, imported from where they are defined (written by tools/api.py)."""
from ..concise import shard, shard_batch
from ..hlo import collective_ops, HLO_BYTES
from ..models import lenet, num_correct
from ..utils import Accumulator

__all__ = ["Accumulator", "HLO_BYTES", "collective_ops", "lenet", "num_correct", "shard", "shard_batch"]
