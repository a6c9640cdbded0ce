"""The smoke switch: one environment variable that shrinks data and work for quick checks.

``D2L_MULTI_SMOKE=1`` makes the data modules keep only a few thousand examples and the
library's longer loops take fewer steps, so every notebook and command runs in seconds; the
notebooks' cells do not change. The default (unset) is the real, full run. Numbers printed in
smoke mode are not results.
"""
import os

SMOKE_ENV = "D2L_MULTI_SMOKE"


def smoke():
    """Return True when the smoke switch ``D2L_MULTI_SMOKE`` is on (1/true/yes/on)."""
    return os.environ.get(SMOKE_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def pick(full, smoke_value):
    """Return ``smoke_value`` in smoke mode and ``full`` otherwise."""
    return smoke_value if smoke() else full


def shrink(n, smoke_n):
    """``n`` in a full run; in smoke mode at most ``smoke_n`` (``n=None`` means 'all')."""
    if not smoke():
        return n
    return smoke_n if n is None else min(n, smoke_n)
