"""What the ``#@save`` code of ``d2l_multi.schedule`` calls as ``d2l.NAME``:
functions of earlier notebooks, imported from where they are defined (written by tools/api.py)."""
from ..hlo import COLLECTIVES

__all__ = ["COLLECTIVES"]
