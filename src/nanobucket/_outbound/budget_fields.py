"""Reading the budgets an answer announces: OpenAI-style and Anthropic-style rate limit
fields (requests, tokens, input and output tokens at once), and ``retry-after-ms``.

`parse_budgets` reads each budget of `BUDGETS` into a `Budget` (limit, remaining,
ns until its reset): ``x-ratelimit-{limit,remaining,reset}-{requests,tokens}``
with Go durations (`parse_go_duration`), ``anthropic-ratelimit-{requests,tokens,
input-tokens,output-tokens}-{limit,remaining,reset}`` with RFC 3339 times
(`parse_rfc3339`) read against the answer's ``Date``, else this machine's clock.
`parse_pause` reads ``retry-after-ms``, else ``retry-after``. No reset or pause is
longer than a day (`MAX_WAIT_S`); a field that does not parse is as if absent.
"""

from __future__ import annotations

import calendar
import functools
import math
import re
import time
from fractions import Fraction
from typing import NamedTuple

from .._core._params import NS_PER_S
from .fields import MAX_WAIT_S, Get, WallClock, _wall_ns, parse_retry_after

__all__ = (
    "BUDGETS",
    "BUDGET_FIELDS",
    "FAMILIES",
    "Budget",
    "parse_budgets",
    "parse_go_duration",
    "parse_pause",
    "parse_rfc3339",
    "rfc3339_reset",
)

#: The budgets a provider announces, by the names an estimate and a settle use.
BUDGETS = ("requests", "tokens", "input-tokens", "output-tokens")
_OPENAI = ("requests", "tokens")  # x-ratelimit-*-requests, x-ratelimit-*-tokens
_MAX_WAIT_NS = MAX_WAIT_S * NS_PER_S
_MAX_TEXT = 64  # longer values are not read
# Each budget's (limit, remaining, reset) field names, and the budget's name
_OPENAI_NAMES = tuple(
    (f"x-ratelimit-limit-{n}", f"x-ratelimit-remaining-{n}", f"x-ratelimit-reset-{n}", n)
    for n in _OPENAI
)
_ANTHROPIC_NAMES = tuple(
    (*(f"anthropic-ratelimit-{n}-{field}" for field in ("limit", "remaining", "reset")), n)
    for n in BUDGETS
)
#: The families: each budget's (limit, remaining, reset) field names and its name, and
#: whether their resets are Go durations (else RFC 3339 times)
FAMILIES = ((_OPENAI_NAMES, True), (_ANTHROPIC_NAMES, False))
#: Every field `parse_budgets` and `parse_pause` read, by lower-case name.
BUDGET_FIELDS = frozenset(
    {name for names in _OPENAI_NAMES + _ANTHROPIC_NAMES for name in names[:3]}
    | {"retry-after-ms", "retry-after", "date"}
)

_GO_UNIT = {"ns": 1, "us": 10**3, "µs": 10**3, "μs": 10**3, "ms": 10**6, "s": NS_PER_S}
_GO_UNIT |= {"m": 60 * NS_PER_S, "h": 3600 * NS_PER_S}
_GO_TOO_LONG = 1 << 63  # ns: past Go's int64 durations
# ASCII digits only, as Go reads them (``\d`` takes any script's)
_GO_PART = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h)")
# The forms providers send (``340ms``, ``1.5s``, ``6m0s``, ``3m12.045s``), read in one match
_GO_USUAL = re.compile(r"(?:([0-9]{1,6})m)?([0-9]{1,9})(?:\.([0-9]{1,9}))?(m?s)")
# ASCII digits only (``\d`` takes any script's); a fraction of any length (RFC 3339
# sets none), which `parse_rfc3339` rounds up to the ns.
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt ]([0-9]{2}):([0-9]{2}):([0-9]{2})(\.[0-9]+)?"
    r"([Zz]|[+-][0-9]{2}:[0-9]{2})\Z"
)


class Budget(NamedTuple):
    """One budget as an answer announces it: its limit, what is left, and ns until reset."""

    limit: int
    remaining: int
    reset_ns: int


_budget = tuple.__new__  # a Budget from its fields, without NamedTuple's Python __new__


def parse_go_duration(text: str) -> int | None:
    """A Go duration (``1h2m3.5s``, ``6m0s``, ``12ms``, ``0``) in ns, rounded up, at most
    a day; None if it is not one, as Go's ``time.ParseDuration`` reads it (too long for
    a Go duration, 2**63 ns, is not one either), or if it is negative.

    >>> parse_go_duration("6m0s"), parse_go_duration("12ms"), parse_go_duration("1h2m3.5s")
    (360000000000, 12000000, 3723500000000)
    >>> parse_go_duration("1.5us"), parse_go_duration("0"), parse_go_duration("-1s")
    (1500, 0, None)
    """
    text = text.strip()
    if text[-2:] == "ms":  # the commonest form, whole ms, read without a match
        whole = text[:-2]
        if whole.isdigit() and whole.isascii() and len(whole) <= 9:
            return min(int(whole) * 1_000_000, _MAX_WAIT_NS)
    if len(text) > _MAX_TEXT:
        return None
    if text[:1] == "+":  # Go takes a sign (a negative duration is no reset here)
        text = text[1:]
    usual = _GO_USUAL.fullmatch(text)
    if usual is not None:
        minutes, whole, decimals, unit = usual.groups()
        if decimals is None:
            ns = int(whole) * _GO_UNIT[unit]
        else:  # rounded up, as the sum below is
            part = 10 ** len(decimals)
            ns = -(-(int(whole) * part + int(decimals)) * _GO_UNIT[unit] // part)
        if minutes is not None:
            ns += int(minutes) * 60 * NS_PER_S
        return ns if ns < _MAX_WAIT_NS else _MAX_WAIT_NS
    if text == "0":
        return 0
    if not text:
        return None
    # The sum in exact integers: ns times *scale*, the largest power of ten a part's
    # decimals need (every smaller one divides it).
    total, scale = 0, 1
    at = 0
    for match in _GO_PART.finditer(text):
        if match.start() != at:
            return None
        at = match.end()
        whole, _, decimals = match[1].partition(".")
        part = 10 ** len(decimals)
        if part > scale:
            total *= part // scale
            scale = part
        value = int(whole or "0") * part + int(decimals or "0")
        total += value * _GO_UNIT[match[2]] * (scale // part)
    if at != len(text) or at == 0 or total >= _GO_TOO_LONG * scale:
        return None
    return min(-(-total // scale), _MAX_WAIT_NS)


def parse_rfc3339(text: str) -> int | None:
    """An RFC 3339 time (``2026-12-06T19:00:30.5Z``, ``...+02:00``) in ns since the Unix
    epoch, exact to the ns written; None if it is not one.

    >>> parse_rfc3339("1970-01-01T00:00:01.25Z"), parse_rfc3339("1970-01-01T02:00:00+02:00")
    (1250000000, 0)
    >>> parse_rfc3339("yesterday") is None
    True
    """
    match = _RFC3339.match(text.strip()) if len(text) <= _MAX_TEXT else None
    if match is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in match.groups()[:6])
    try:
        whole = calendar.timegm((year, month, day, hour, minute, min(second, 59), 0, 0, 0))
    except (ValueError, OverflowError):
        return None
    if not (1 <= month <= 12 and 1 <= day <= calendar.monthrange(year, month)[1]):
        return None
    if hour > 23 or minute > 59 or second > 60:
        return None
    zone = match[8]
    if zone not in {"Z", "z"}:
        hours, minutes = int(zone[1:3]), int(zone[4:6])
        if hours > 23 or minutes > 59:
            return None
        sign = -1 if zone[0] == "+" else 1  # +02:00 is two hours ahead of UTC
        whole += sign * (hours * 3600 + minutes * 60)
    digits = (match[7] or ".")[1:]
    # Past the ns, rounded up: a reset is never read earlier than it was written.
    fraction = int(digits[:9].ljust(9, "0")) + (digits[9:].strip("0") != "")
    return (whole + (second == 60)) * NS_PER_S + fraction


# `parse_rfc3339` remembered: a provider's resets are whole seconds, the same text for
# many answers and for several budgets of one (only short texts are given)
_rfc3339_ns = functools.lru_cache(maxsize=256)(parse_rfc3339)


def rfc3339_reset(text: str, wall_ns: int) -> int | None:
    """ns from *wall_ns* (since the epoch) until the RFC 3339 time *text*: 0 if it is
    past, at most a day; None if it is not one.

    >>> rfc3339_reset("1970-01-01T00:00:02Z", 500_000_000), rfc3339_reset("soon", 0)
    (1500000000, None)
    """
    at = _rfc3339_ns(text) if len(text) <= _MAX_TEXT else None
    return None if at is None else min(max(at - wall_ns, 0), _MAX_WAIT_NS)


def _count(text: str) -> int | None:
    """A count: ASCII digits, at most 18 of them, with whitespace around them (what
    ``str.strip`` takes); else None. `parse_budgets` reads digits alone (most counts)
    before it calls this."""
    text = text.strip()
    if not text.isdigit() or not text.isascii():
        return None
    return int(text) if len(text) <= 18 else None


def parse_budgets(get: Get, wall_clock: WallClock = time.time_ns) -> dict[str, Budget]:
    """The budgets an answer announces (by name of `BUDGETS`); a budget whose limit,
    remaining or reset is missing or does not parse is left out. An RFC 3339 reset
    is read against the answer's ``Date``, else *wall_clock* (int ns since the epoch).

    >>> parse_budgets({"x-ratelimit-limit-tokens": "600", "x-ratelimit-remaining-tokens": "0",
    ...                "x-ratelimit-reset-tokens": "1.5s"}.get)
    {'tokens': Budget(limit=600, remaining=0, reset_ns=1500000000)}
    >>> parse_budgets({"anthropic-ratelimit-requests-limit": "50",
    ...                "anthropic-ratelimit-requests-remaining": "49",
    ...                "anthropic-ratelimit-requests-reset": "1970-01-01T00:00:02Z"}.get, lambda: 0)
    {'requests': Budget(limit=50, remaining=49, reset_ns=2000000000)}
    """
    found: dict[str, Budget] = {}
    wall_ns: int | None = None
    for names, go_resets in FAMILIES:
        for limit_name, remaining_name, reset_name, name in names:
            # A budget not announced is one lookup: most answers announce few, or none.
            text = get(limit_name)
            if text is None:
                continue
            # `_count`, its digits-alone case (most counts) written out
            limit = (
                int(text) if text.isdigit() and text.isascii() and len(text) <= 18 else _count(text)
            )
            text = get(remaining_name)
            if limit is None or text is None:
                continue
            remaining = (
                int(text) if text.isdigit() and text.isascii() and len(text) <= 18 else _count(text)
            )
            reset = get(reset_name)
            if remaining is None or reset is None:
                continue
            if go_resets:  # a Go duration from now
                reset_ns = parse_go_duration(reset)
                if reset_ns is None:
                    continue
            else:  # an RFC 3339 time, read against the answer's Date
                if wall_ns is None:
                    wall_ns = _wall_ns(get, wall_clock)
                reset_ns = rfc3339_reset(reset, wall_ns)
                if reset_ns is None:
                    continue
            found[name] = _budget(Budget, (limit, min(remaining, limit), reset_ns))
    return found


def parse_pause(get: Get, wall_clock: WallClock = time.time_ns) -> int | None:
    """``retry-after-ms``, else ``retry-after``, in ns from now (at most a day); else None.

    >>> parse_pause({"retry-after-ms": "250", "retry-after": "1"}.get)
    250000000
    >>> parse_pause({"retry-after": "2"}.get), parse_pause({}.get)
    (2000000000, None)
    """
    text = get("retry-after-ms")
    if text is not None and len(text) <= _MAX_TEXT:
        try:
            ms = Fraction(text.strip())
        except (ValueError, ZeroDivisionError):
            ms = None
        if ms is not None and ms >= 0:
            return min(math.ceil(ms * 10**6), _MAX_WAIT_NS)
    return parse_retry_after(get, wall_clock)
