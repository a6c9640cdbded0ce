"""The smoke switch: one environment variable that shrinks data and work for quick checks.

``D2L_MULTI_SMOKE=1`` makes the data modules keep only a few thousand examples and the
library's longer loops take fewer steps, so every notebook and command runs in seconds; the
notebooks' cells do not change. The default (unset) is the real, full run. Numbers printed in
smoke mode are not results.
"""
from typing import TypeVar

from ._checks import env_flag

SMOKE_ENV = "D2L_MULTI_SMOKE"
T = TypeVar("T")


def smoke() -> bool:
    """Return True when the smoke switch ``D2L_MULTI_SMOKE`` is on (1/true/yes/on); an
    InputError names any value but those, 0/false/no/off and empty."""
    return env_flag(SMOKE_ENV)


def pick(full: T, smoke_value: T) -> T:
    """Return ``smoke_value`` in smoke mode and ``full`` otherwise."""
    return smoke_value if smoke() else full


def shrink(n: int | None, smoke_n: int) -> int | None:
    """``n`` in a full run; in smoke mode at most ``smoke_n`` (``n=None`` means 'all')."""
    if not smoke():
        return n
    return smoke_n if n is None else min(n, smoke_n)
