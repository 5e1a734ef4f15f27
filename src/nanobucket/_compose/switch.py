"""The switch that turns every HTTP limit and ``@limit`` off (a test run's).

``off`` is read by the gate on every request and by `nanobucket.decorator.limit`
on every call: while it is true they admit without deciding (no key read, no
token spent, no counter, hook or header). It starts as ``NANOBUCKET_DISABLED``
says at import (anything but unset, empty or ``0`` is on) and
`nanobucket.testing.disabled` turns it on for a block. One flag for the
process, not per thread or task: a test client runs the app in another thread.

>>> from nanobucket._compose import switch
>>> last = switch.turn_off(True)
>>> switch.off
True
>>> switch.turn_off(last) is True, switch.off is last
(True, True)
"""

from __future__ import annotations

import os

__all__ = ("off", "turn_off")

#: True while every HTTP limit and ``@limit`` admits without deciding.
off: bool = os.environ.get("NANOBUCKET_DISABLED", "") not in ("", "0")


def turn_off(flag: bool) -> bool:
    """Set `off` to *flag* (a bool); return what it was."""
    global off
    if not isinstance(flag, bool):
        raise TypeError(f"flag must be a bool, not {type(flag).__name__}")
    last, off = off, flag
    return last
