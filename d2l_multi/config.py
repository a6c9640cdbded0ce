"""The smoke switch: one environment variable that shrinks epochs and data.

CI sets ``D2L_MULTI_SMOKE=1`` so every notebook and command runs in seconds. The default
(unset) is the real, full run; numbers printed in smoke mode are not results.
"""
import os

SMOKE_ENV = "D2L_MULTI_SMOKE"


def smoke():
    """Return True when the smoke switch ``D2L_MULTI_SMOKE`` is on (1/true/yes/on)."""
    return os.environ.get(SMOKE_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def pick(full, smoke_value):
    """Return ``smoke_value`` in smoke mode and ``full`` otherwise."""
    return smoke_value if smoke() else full
