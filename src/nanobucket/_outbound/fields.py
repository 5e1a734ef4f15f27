"""Reading what a response says of its limit: ``RateLimit-Policy`` / ``RateLimit``,
``X-RateLimit-*`` and ``Retry-After``.

Most answers carry none of these fields, and an answer that does carries
the same ``RateLimit-Policy`` every time: `FIELDS` names the fields read,
so an adapter can look for them in one pass over the answer's header list
(and skip everything when there are none), and a policy field's text is
parsed once (a small cache), as are the ``X-RateLimit-Limit`` and ``-Reset``
texts that answers repeat while only their remaining changes. Whole
numbers, the common case, are read as ``int``; exact fractions only where a
field has decimals. A field that does not parse is ignored, as if absent;
see `nanobucket._outbound.pacer`.
"""

from __future__ import annotations

import email.utils
import functools
import math
import time
from collections.abc import Callable, Iterable, Mapping
from fractions import Fraction
from typing import NamedTuple

from .._core._params import NS_PER_S

__all__ = (
    "FIELDS",
    "MAX_FIELD",
    "MAX_WAIT_S",
    "TRIGGERS",
    "Announced",
    "Get",
    "WallClock",
    "collect",
    "fields_of",
    "one_state",
    "parse_limits",
    "parse_retry_after",
    "remaining_after",
    "told",
)

Get = Callable[[str], "str | None"]  # a response's header by name, case-insensitive

MAX_FIELD = 4096  # longer fields are not read
MAX_WAIT_S = 86_400  # a server asking for longer is heard as one day
_EPOCH = 10**9  # a reset above this is a Unix time (2001-09-09), not a delta
_MAX_DIGITS = 15
_MAX_WAIT_NS = MAX_WAIT_S * NS_PER_S

#: The fields that say something of a limit (lower case): an answer with none
#: of them teaches nothing but its status.
TRIGGERS = frozenset(
    {"ratelimit-policy", "ratelimit", "retry-after"}
    | {f"{p}ratelimit-{n}" for p in ("", "x-") for n in ("limit", "remaining", "reset")}
)
#: Every field read: the triggers, and ``Date`` (a clock for HTTP dates and Unix times).
FIELDS = TRIGGERS | {"date"}


def collect(items: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The `FIELDS` among *items* (name, value), by lower-case name; repeats joined by ", ".

    >>> collect([("Server", "x"), ("RateLimit", '"d";r=1;t=1'), ("X-RateLimit-Limit", "5")])
    {'ratelimit': '"d";r=1;t=1', 'x-ratelimit-limit': '5'}
    """
    found: dict[str, str] = {}
    for raw_name, value in items:
        name = raw_name.lower()
        if name in FIELDS:
            found[name] = f"{found[name]}, {value}" if name in found else value
    return found


def fields_of(headers: Mapping[str, str]) -> dict[str, str] | None:
    """The `FIELDS` of *headers* (any mapping), or None when it has no `TRIGGERS` one.

    >>> fields_of({"Date": "now"}), fields_of({"Retry-After": "2", "Date": "now"})
    (None, {'retry-after': '2', 'date': 'now'})
    """
    found = collect(headers.items())
    return None if TRIGGERS.isdisjoint(found) else found


# --------------------------------------------------------------------------
# Numbers and lists


def _number(text: str) -> Fraction | None:
    """A non-negative decimal (``"2"``, ``"1.5"``) as an exact Fraction, else None."""
    text = text.strip()
    whole, _, frac = text.partition(".")
    if not whole.isdigit() or not whole.isascii() or len(whole) > _MAX_DIGITS:
        return None
    if frac and (not frac.isdigit() or not frac.isascii() or len(frac) > 9):
        return None
    return Fraction(int(whole)) + (Fraction(int(frac), 10 ** len(frac)) if frac else 0)


def _whole(text: str) -> int | None:
    """A non-negative whole number (``"7"``, ``" 7 "``, ``"7.0"``), else None."""
    text = text.strip()
    if text.isdigit() and text.isascii():  # the common case: no Fraction
        return int(text) if len(text) <= _MAX_DIGITS else None
    value = _number(text)
    return value.numerator if value is not None and value.denominator == 1 else None


def _split(text: str, sep: str) -> list[str] | None:
    """*text* split at *sep* outside double quotes; None if a quote is left open."""
    if "\\" in text:
        return _split_escaped(text, sep)
    pieces = text.split('"')  # without escapes, odd pieces are the quoted ones
    if len(pieces) % 2 == 0:
        return None
    if len(pieces) == 1:
        return text.split(sep)
    parts = [""]
    for i, piece in enumerate(pieces):
        if i % 2:
            parts[-1] += f'"{piece}"'
        else:
            first, *rest = piece.split(sep)
            parts[-1] += first
            parts += rest
    return parts


def _split_escaped(text: str, sep: str) -> list[str] | None:
    """`_split` for a text with backslashes: a quoted ``\\"`` does not end the quote."""
    parts, start, quoted, escaped = [], 0, False, False
    for i, ch in enumerate(text):
        if escaped:
            escaped = False
        elif quoted and ch == "\\":
            escaped = True
        elif ch == '"':
            quoted = not quoted
        elif ch == sep and not quoted:
            parts.append(text[start:i])
            start = i + 1
    if quoted:
        return None
    parts.append(text[start:])
    return parts


Items = list[tuple["str | int", dict[str, int]]]


def _items(field: str | None) -> Items:
    """The members of a structured-field list: ``(name or integer, integer parameters)``.

    A member that does not parse is left out; a quoted name keeps its text.
    """
    if not field or len(field) > MAX_FIELD:
        return []
    members = _split(field, ",")
    out: Items = []
    for member in members or []:
        parts = _split(member, ";")
        if not parts or not parts[0].strip():
            continue
        head = parts[0].strip()
        item: str | int
        if len(head) >= 2 and head[0] == head[-1] == '"':
            item = head[1:-1].replace('\\"', '"').replace("\\\\", "\\")
        elif (number := _whole(head)) is not None:
            item = number
        elif head.replace("_", "").replace("-", "").isalnum():
            item = head
        else:
            continue
        params: dict[str, int] = {}
        for param in parts[1:]:
            name, eq, value = param.partition("=")
            number = _whole(value) if eq else None
            if number is not None:
                params[name.strip().lower()] = number
        out.append((item, params))
    return out


# --------------------------------------------------------------------------
# Times


# What reading an HTTP date may raise: OSError from a local time out of the
# platform's range (a zone of "-0000" is local time; Windows stops at 3000).
_BAD_DATE = (TypeError, ValueError, IndexError, OverflowError, OSError)


#: This machine's wall clock: int ns since the Unix epoch (`time.time_ns`).
WallClock = Callable[[], int]


@functools.lru_cache(maxsize=64)
def _http_date(text: str) -> int | None:
    """An HTTP date (``Wed, 21 Oct 2015 07:28:00 GMT``) in seconds since the epoch (it
    names whole seconds), or None. Remembered: a server's ``Date`` changes once a
    second, not once an answer (only short texts are given)."""
    try:
        return int(email.utils.parsedate_to_datetime(text).timestamp())
    except _BAD_DATE:
        return None


def _wall_ns(get: Get, wall_clock: WallClock) -> int:
    """The server's time of the response in ns since the epoch: its ``Date``, else
    *wall_clock*'s."""
    date = get("date")
    if date and len(date) < 64:
        seconds = _http_date(date)
        if seconds is not None:
            return seconds * NS_PER_S
    return wall_clock()


def _wall_now(get: Get, wall_clock: WallClock) -> Fraction:
    """`_wall_ns` in seconds."""
    return Fraction(_wall_ns(get, wall_clock), NS_PER_S)


def _seconds_ns(seconds: Fraction | int) -> int:
    return min(math.ceil(seconds * NS_PER_S), _MAX_WAIT_NS)


def parse_retry_after(get: Get, wall_clock: WallClock = time.time_ns) -> int | None:
    """``Retry-After`` in ns from now (seconds or an HTTP date), else None.

    A date is read against the response's ``Date`` (the server's clock), or
    *wall_clock* (this machine's) when there is none; a date in the past is 0.

    >>> parse_retry_after({"retry-after": "2"}.get)
    2000000000
    >>> parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:05 GMT",
    ...                    "date": "Wed, 21 Oct 2015 07:28:00 GMT"}.get)
    5000000000
    >>> parse_retry_after({"retry-after": "Wed, 21 Oct 2015 07:28:05 GMT"}.get,
    ...                   lambda: 1445412484 * 10**9)   # 07:28:04 UTC
    1000000000
    >>> parse_retry_after({"retry-after": "soon"}.get) is None
    True
    """
    value = get("retry-after")
    if not value or len(value) > 64:
        return None
    seconds = _number(value)
    if seconds is not None:
        return _seconds_ns(seconds)
    when = _http_date(value.strip())
    if when is None:
        return None
    delta = when - _wall_now(get, wall_clock)
    return _seconds_ns(max(delta, Fraction(0)))


def _reset_ns(value: int, get: Get, wall_clock: WallClock) -> int:
    if value > _EPOCH:
        return _seconds_ns(max(value - _wall_now(get, wall_clock), Fraction(0)))
    return min(value * NS_PER_S, _MAX_WAIT_NS)


# --------------------------------------------------------------------------
# The limit


class Announced(NamedTuple):
    """What a response says of its key's limit; None where it says nothing."""

    rate: Fraction | None  # tokens per second (a policy's q / w)
    limit: int | None  # the most the capacity may be (q, or X-RateLimit-Limit)
    remaining: int | None  # tokens the server has left
    reset_ns: int | None  # ns until the reset
    policy: tuple[int, int] | None  # (q, w) of the policy followed


Policies = tuple[dict[str, tuple[int, int]], "tuple[int, int] | None"]
_POLICIES: dict[str, Policies] = {}  # a RateLimit-Policy text -> its policies
_CACHED = 64  # texts remembered: a server sends one, a hostile one many
_CACHED_LEN = 512  # longer texts are parsed every time


def _policies(field: str | None) -> Policies:
    """The valid policies of a ``RateLimit-Policy`` field by name, and the slowest."""
    if not field:
        return {}, None
    found = _POLICIES.get(field)
    if found is not None:
        return found
    policies = {
        (item if isinstance(item, str) else ""): (
            p.get("q", item if isinstance(item, int) else 0),
            p.get("w", 0),
        )
        for item, p in _items(field)
    }
    valid = {name: (q, w) for name, (q, w) in policies.items() if q >= 1 and w >= 1}
    slowest = min(valid.values(), key=lambda qw: Fraction(qw[0], qw[1])) if valid else None
    found = (valid, slowest)
    if len(field) <= _CACHED_LEN:
        if len(_POLICIES) >= _CACHED:
            _POLICIES.clear()
        _POLICIES[field] = found
    return found


def _states(field: str) -> Items:
    """The members of a ``RateLimit`` field that say what remains (``r``)."""
    parts = field.split(";")
    if len(parts) == 3 and len(field) <= MAX_FIELD:
        # The usual field, one policy's state ('"name";r=7;t=1'): read with a few
        # string operations where the general parser takes many.
        head, r, t = parts
        if (
            head[:1] == '"' == head[-1:]
            and len(head) > 1
            and '"' not in head[1:-1]
            and "\\" not in head
            and r[:2] == "r="
            and t[:2] == "t="
            and (r := r[2:]).isdigit()
            and (t := t[2:]).isdigit()
            and r.isascii()
            and t.isascii()
            and len(r) <= _MAX_DIGITS
            and len(t) <= _MAX_DIGITS
        ):
            return [(head[1:-1], {"r": int(r), "t": int(t)})]
    return [(item, p) for item, p in _items(field) if "r" in p]


def one_state(field: str) -> str | None:
    """The text up to ``r=`` of a ``RateLimit`` field of one policy's state, read by
    `_states` without the general parser; else None. See `remaining_after`.

    >>> one_state('"default";r=7;t=1'), one_state('"a";r=7;t=1, "b";r=1;t=1')
    ('"default";r=', None)
    """
    states = _states(field)
    if len(states) != 1 or not isinstance(states[0][0], str):
        return None
    prefix = f'"{states[0][0]}";r='
    return prefix if field.startswith(prefix) and field.count(";") == 2 else None


def remaining_after(prefix: str, field: str) -> int | None:
    """The remaining of *field* when it is *prefix* (from `one_state`), digits, ``;t=``
    and digits: the same policy's state; else None (read it with `parse_limits`).

    >>> remaining_after('"default";r=', '"default";r=41;t=1')
    41
    >>> remaining_after('"default";r=', '"other";r=41;t=1') is None
    True
    """
    if not field.startswith(prefix):
        return None
    r, sep, t = field[len(prefix) :].partition(";t=")
    if (
        sep
        and r.isdigit()
        and t.isdigit()
        and r.isascii()
        and t.isascii()
        and len(r) <= _MAX_DIGITS
        and len(t) <= _MAX_DIGITS
    ):
        return int(r)
    return None


_NO_POLICIES: Policies = ({}, None)
# (RateLimit-Policy, RateLimit) texts -> what they announce. A server far from
# its limit says the same remaining every time; one near it cycles a few values.
_SAID: dict[tuple[str | None, str], Announced] = {}
_announced = tuple.__new__  # an Announced from its fields, without NamedTuple's Python __new__
_PLAIN = ("ratelimit-limit", "ratelimit-remaining", "ratelimit-reset")  # read first
_X = ("x-ratelimit-limit", "x-ratelimit-remaining", "x-ratelimit-reset")
# (X-RateLimit-Limit, X-RateLimit-Reset) texts -> the limit and the reset (ns) they say,
# when an answer with no other limit field said them: most answers change the remaining only.
_LEGACY: dict[tuple[str | None, str | None], tuple[int | None, int | None]] = {}


def told(policy_field: str | None, state_field: str) -> Announced | None:
    """What `parse_limits` read from these ``RateLimit-Policy`` and ``RateLimit`` texts
    alone (no other field: no Date, no ``X-RateLimit-*``), if it read them lately.

    >>> a = parse_limits({"ratelimit-policy": '"p";q=5;w=1', "ratelimit": '"p";r=4;t=1'}.get)
    >>> told('"p";q=5;w=1', '"p";r=4;t=1') is a, told(None, '"p";r=4;t=1')
    (True, None)
    """
    return _SAID.get((policy_field, state_field))


@functools.lru_cache(maxsize=64)
def _rate(policy: tuple[int, int]) -> Fraction:
    return Fraction(policy[0], policy[1])


def parse_limits(get: Get, wall_clock: WallClock = time.time_ns) -> Announced | None:
    """The limit a response announces (IETF fields first, then ``X-RateLimit-*``), or None.

    A reset given as a Unix time is read as `parse_retry_after` reads a date.

    >>> a = parse_limits({"ratelimit-policy": '"default";q=50;w=1',
    ...                   "ratelimit": '"default";r=7;t=1'}.get)
    >>> a.rate, a.limit, a.remaining, a.reset_ns
    (Fraction(50, 1), 50, 7, 1000000000)
    >>> parse_limits({"x-ratelimit-limit": "10", "x-ratelimit-remaining": "0"}.get).remaining
    0
    >>> parse_limits({"ratelimit-policy": "q=oops"}.get) is None
    True
    """
    policy_text, state_text = get("ratelimit-policy"), get("ratelimit")
    if state_text:
        said = (policy_text, state_text)
        known = _SAID.get(said)
        if known is not None:
            return known
    elif not policy_text:
        texts = (get("x-ratelimit-limit"), get("x-ratelimit-reset"))
        read = _LEGACY.get(texts)
        if read is not None:
            # The same limit and reset as an answer read lately: only the remaining is new.
            text = get("x-ratelimit-remaining")
            if (
                text is not None
                and text.isdigit()
                and text.isascii()
                and len(text) <= _MAX_DIGITS
                and get("ratelimit-limit") is None
                and get("ratelimit-remaining") is None
                and get("ratelimit-reset") is None
            ):
                return _announced(Announced, (None, read[0], int(text), read[1], None))
    policies, slowest = _policies(policy_text) if policy_text else _NO_POLICIES
    states = _states(state_text) if state_text else []
    policy: tuple[int, int] | None = None
    remaining = reset = None
    if states:
        item, p = min(states, key=lambda s: s[1]["r"]) if len(states) > 1 else states[0]
        remaining, reset = p["r"], p.get("t")
        policy = policies.get(item if isinstance(item, str) else "")
    if policy is None:
        policy = slowest
    limit = policy[0] if policy is not None else None
    legacy = False  # read from X-RateLimit-* alone
    if remaining is None:
        for names in (_PLAIN, _X):
            found = [_first_int(get(name)) for name in names]
            if any(v is not None for v in found):
                if limit is None and found[0] is not None and found[0] >= 1:
                    limit = found[0]
                remaining, reset = found[1], found[2]
                legacy = names is _X and policy is None
                break
    if policy is None and limit is None and remaining is None:
        return None
    announced: Announced = _announced(
        Announced,
        (
            _rate(policy) if policy is not None else None,
            limit,
            remaining,
            _reset_ns(reset, get, wall_clock) if reset is not None else None,
            policy,
        ),
    )
    if (
        states
        and state_text
        and (reset is None or reset <= _EPOCH)
        and len(state_text) <= _CACHED_LEN
    ):
        # Read from the two IETF fields alone (no Date, no X-RateLimit-*): the same
        # texts say the same next time.
        if len(_SAID) >= _CACHED:
            _SAID.clear()
        _SAID[said] = announced
    elif legacy and (reset is None or reset <= _EPOCH):
        texts = (get("x-ratelimit-limit"), get("x-ratelimit-reset"))
        if all(t is None or len(t) <= _CACHED_LEN for t in texts):
            # Neither depends on the Date: the same texts say the same next time.
            if len(_LEGACY) >= _CACHED:
                _LEGACY.clear()
            _LEGACY[texts] = (limit, announced.reset_ns)
    return announced


def _first_int(field: str | None) -> int | None:
    """The first member of *field* when it is a whole number (``"100"``, ``"100, 100;w=60"``)."""
    if field is None:
        return None
    if field.isdigit() and field.isascii():  # the usual "100"
        return int(field) if len(field) <= _MAX_DIGITS else None
    items = _items(field)
    return items[0][0] if items and isinstance(items[0][0], int) else None
