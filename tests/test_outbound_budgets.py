"""Pacing by several budgets at once: the LLM header families, estimate and settle.

Time is a manual clock that the sleeps move, so every wait is exact.
"""

from __future__ import annotations

import asyncio
import datetime
import json
import math
import re
from fractions import Fraction
from types import ModuleType
from typing import Any

import httpx
import pytest
import requests
from hypothesis import example, given, settings
from hypothesis import strategies as st

import nanobucket as nb
from nanobucket._outbound.budget_fields import (
    Budget,
    _rfc3339_ns,
    parse_budgets,
    parse_go_duration,
    parse_pause,
    parse_rfc3339,
    rfc3339_reset,
)
from nanobucket._outbound.budgets import _MAX_WAIT_NS, Charge, Ledger, _due
from nanobucket._outbound.fields import _http_date
from nanobucket.httpx import AsyncRateLimitedTransport, RateLimitedTransport, RateLimitTimeout
from nanobucket.requests import RateLimitedAdapter

from conftest import ManualClock

MS = 1_000_000
S = 1_000_000_000


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("1s", S), ("6m0s", 360 * S), ("12ms", 12 * MS), ("1h2m3.5s", 3723 * S + S // 2),
        ("0", 0), ("0s", 0), ("250us", 250_000), ("3µs", 3_000), ("7ns", 7),
        ("1.0000000001s", S + 1),
        ("48h", 86_400 * S),  # at most a day
    ],
)  # fmt: skip
def test_go_durations_in_exact_ns(text: str, ns: int) -> None:
    assert parse_go_duration(text) == ns


_GO_UNITS = {"ns": 1, "us": 10**3, "µs": 10**3, "μs": 10**3, "ms": 10**6, "s": S}
_GO_UNITS |= {"m": 60 * S, "h": 3600 * S}
_U63 = 1 << 63


def _go_parse_duration(text: str) -> Fraction | str | None:
    """Go's ``time.ParseDuration``, ported line by line (Go 1.22, src/time/format.go) over
    the text's UTF-8 bytes: None where Go returns a syntax error, ``"overflow"`` where
    it returns its overflow error, else the duration the text writes, in exact ns (Go
    itself truncates the fractions through a float64, below the ns)."""
    data = text.encode()
    if data[:1] in {b"-", b"+"}:
        negative, data = data[:1] == b"-", data[1:]
    else:
        negative = False
    if data == b"0":
        return Fraction(0)
    if not data:
        return None
    total = 0  # Go's d, with its checks
    exact = Fraction(0)
    while data:
        if not (data[0] == ord(".") or ord("0") <= data[0] <= ord("9")):
            return None
        i, whole = 0, 0  # leadingInt
        while i < len(data) and ord("0") <= data[i] <= ord("9"):
            if whole > _U63 // 10:
                return "overflow"
            whole = whole * 10 + data[i] - ord("0")
            if whole > _U63:
                return "overflow"
            i += 1
        before, data = i > 0, data[i:]
        fraction, scale, written, after = 0, 1, Fraction(0), False
        if data[:1] == b".":
            data = data[1:]
            i, lost = 0, False  # leadingFraction
            while i < len(data) and ord("0") <= data[i] <= ord("9"):
                digit = data[i] - ord("0")
                written += Fraction(digit, 10 ** (i + 1))
                if not lost:
                    if fraction > (_U63 - 1) // 10 or fraction * 10 + digit > _U63:
                        lost = True
                    else:
                        fraction, scale = fraction * 10 + digit, scale * 10
                i += 1
            after, data = i > 0, data[i:]
        if not before and not after:
            return None
        i = 0
        while i < len(data) and not (data[i] == ord(".") or ord("0") <= data[i] <= ord("9")):
            i += 1
        unit = _GO_UNITS.get(data[:i].decode(errors="replace")) if i else None
        if unit is None:
            return None  # a missing or unknown unit
        data = data[i:]
        if whole > _U63 // unit:
            return "overflow"
        value = whole * unit
        if fraction > 0:
            value += int(float(fraction) * (float(unit) / float(scale)))
            if value > _U63:
                return "overflow"
        total += value
        if total > _U63:
            return "overflow"
        exact += (whole + written) * unit
    if not negative and total > _U63 - 1:
        return "overflow"
    return -exact if negative else exact


_NS, _US, _MS, _M, _H = 1, 10**3, 10**6, 60 * S, 3600 * S


@pytest.mark.parametrize(
    ("text", "go_ns"),
    [
        # Go's own table (src/time/time_test.go, parseDurationTests): what Go reads.
        ("0", 0), ("5s", 5 * S), ("30s", 30 * S), ("1478s", 1478 * S), ("-5s", -5 * S),
        ("+5s", 5 * S), ("-0", 0), ("+0", 0), ("5.0s", 5 * S), ("5.6s", 5 * S + 600 * _MS),
        ("5.s", 5 * S), (".5s", 500 * _MS), ("1.0s", S), ("1.00s", S), ("1.004s", S + 4 * _MS),
        ("1.0040s", S + 4 * _MS), ("100.00100s", 100 * S + _MS), ("10ns", 10), ("11us", 11 * _US),
        ("12µs", 12 * _US), ("12μs", 12 * _US), ("13ms", 13 * _MS), ("14s", 14 * S),
        ("15m", 15 * _M), ("16h", 16 * _H), ("3h30m", 3 * _H + 30 * _M),
        ("10.5s4m", 4 * _M + 10 * S + 500 * _MS), ("-2m3.4s", -(2 * _M + 3 * S + 400 * _MS)),
        ("1h2m3s4ms5us6ns", _H + 2 * _M + 3 * S + 4 * _MS + 5 * _US + 6),
        ("39h9m14.425s", 39 * _H + 9 * _M + 14 * S + 425 * _MS),
        ("52763797000ns", 52763797000), ("0.3333333333333333333h", 20 * _M),
        ("9007199254740993ns", (1 << 53) + 1), ("9223372036854775807ns", (1 << 63) - 1),
        ("9223372036854775.807us", (1 << 63) - 1), ("9223372036s854ms775us807ns", (1 << 63) - 1),
        ("-9223372036854775808ns", -(1 << 63)), ("-9223372036854775.808us", -(1 << 63)),
        ("-2562047h47m16.854775808s", -(1 << 63)), ("0.100000000000000000000h", 6 * _M),
        ("0.830103483285477580700h", 49 * _M + 48 * S + 372539827),
        # and what it refuses (None: its syntax errors; "overflow": its overflow error)
        ("", None), ("3", None), ("-", None), ("s", None), (".", None), ("-.", None),
        (".s", None), ("+.s", None), ("1d", None), ("\x85\x85", None), ("\xffff", None),
        ("hello \xffff world", None), ("9223372036854775810ns", "overflow"),
        ("9223372036854775808ns", "overflow"), ("-9223372036854775809ns", "overflow"),
        ("9223372036854775.808us", "overflow"), ("9223372036854ms775us808ns", "overflow"),
    ],
)  # fmt: skip
def test_the_go_reference_reads_gos_own_table(text: str, go_ns: int | str | None) -> None:
    # The reference the differential tests hold `parse_go_duration` to is exact where Go
    # goes through a float64 (0.3333333333333333333h): within a ns of Go's answer.
    read = _go_parse_duration(text)
    if isinstance(go_ns, int):
        assert isinstance(read, Fraction) and abs(read - go_ns) < 1
    else:
        assert read == go_ns


def _go_duration_for_a_reset(text: str) -> int | None:
    """What `parse_go_duration` should read from *text*: Go's duration rounded up to the ns
    and at most a day; None for what Go refuses (too long for it too) and for a
    negative duration (no reset is in the past)."""
    text = text.strip()
    if len(text) > 64 or text.startswith("-"):
        return None
    go = _go_parse_duration(text)
    if not isinstance(go, Fraction):
        return None
    return min(math.ceil(go), 86_400 * S)


GO_PART = st.tuples(
    st.sampled_from(["", "0", "1", "7", "12", "007", "99999", "1" * 20, "١"]),
    st.sampled_from(["", ".", ".0", ".5", ".25", ".000000001", ".1234567891234", ".999999999"]),
    st.sampled_from(["ns", "us", "µs", "μs", "ms", "s", "m", "h", "x", ""]),
).map("".join)


@settings(max_examples=500, deadline=None)
@given(
    parts=st.lists(GO_PART, max_size=4),
    pad=st.sampled_from(["", " "]),
    sign=st.sampled_from(["", "", "+", "-", "++"]),
)
@example(parts=[".1234567891234ns"] * 4, pad="", sign="+")  # 65 characters with its sign
def test_go_durations_read_as_go_reads_them(parts: list[str], pad: str, sign: str) -> None:
    # Generated texts, Go durations and not (a part with no digits, no unit, an
    # unknown unit, Arabic-Indic digits, 20 digits: Go's overflow), against Go's own
    # parser ported: the same texts refused, the same ns (rounded up) read.
    text = pad + sign + "".join(parts) + pad
    assert parse_go_duration(text) == _go_duration_for_a_reset(text)


@pytest.mark.parametrize("text", ["", "-1s", "1", "s", "1x", "1s 2m", "1.s2", "1e3s", "m1"])
def test_what_is_not_a_go_duration_is_none(text: str) -> None:
    assert parse_go_duration(text) is None


@pytest.mark.parametrize(
    ("text", "ns"),
    [
        ("1970-01-01T00:00:00Z", 0),
        ("1970-01-01T00:00:01.000000001Z", S + 1),
        ("1970-01-01t00:00:00.5z", S // 2),
        ("1970-01-01T01:00:00+01:00", 0),
        ("1969-12-31T23:30:00-00:30", 0),
        ("2025-08-21T12:40:59Z", 1_755_780_059 * S),
    ],
)
def test_rfc3339_times_in_exact_ns(text: str, ns: int) -> None:
    assert parse_rfc3339(text) == ns


@pytest.mark.parametrize(
    "text", ["2025-02-30T00:00:00Z", "2025-01-01T24:00:00Z", "2025-01-01T00:00:00", "soon", ""]
)
def test_what_is_not_an_rfc3339_time_is_none(text: str) -> None:
    assert parse_rfc3339(text) is None


def _rfc3339_by_datetime(text: str) -> int | None:
    """An RFC 3339 time in ns since the epoch as Python's `datetime` reads it: the grammar
    of RFC 3339 (ASCII digits, a fraction of any length, ``T`` or a space, ``Z`` or an
    offset), each field's range and the calendar checked by `datetime`, a leap second
    (``:60``) read as the second after ``:59``, the fraction rounded up to the ns."""
    match = re.fullmatch(
        r"([0-9]{4}-[0-9]{2}-[0-9]{2})[Tt ]([0-9]{2}:[0-9]{2}):([0-9]{2})(?:\.([0-9]+))?"
        r"([Zz]|[+-][0-9]{2}:[0-9]{2})",
        text.strip(),
    )
    if match is None:
        return None
    date, hour_minute, second, fraction, zone = match.groups()
    leap = second == "60"
    zone = "+00:00" if zone in {"Z", "z"} else zone
    if int(zone[1:3]) > 23 or int(zone[4:6]) > 59:
        return None  # RFC 3339's time-numoffset: hours 00-23, minutes 00-59
    try:
        at = datetime.datetime.fromisoformat(
            f"{date}T{hour_minute}:{'59' if leap else second}{zone}"
        )
    except ValueError:
        return None
    fraction = fraction or ""
    ns = int(fraction[:9].ljust(9, "0")) + (fraction[9:].strip("0") != "")
    seconds = int(at.timestamp()) + leap
    return seconds * S + ns


def _two_digits(most: int) -> st.SearchStrategy[str]:
    return st.integers(0, most).map("{:02d}".format)


RFC3339_TEXT = st.tuples(
    st.sampled_from(["0000", "0001", "1969", "1970", "2000", "2024", "2025", "2100", "9999"]),
    _two_digits(13).map(lambda m: "-" + m),
    _two_digits(32).map(lambda d: "-" + d),
    st.sampled_from(["T", "t", " ", "_"]),
    _two_digits(25),
    _two_digits(61).map(lambda m: ":" + m),
    _two_digits(61).map(lambda s: ":" + s),
    st.one_of(st.just(""), st.text("0123456789", min_size=0, max_size=14).map(lambda f: "." + f)),
    st.one_of(
        st.sampled_from(["Z", "z", "", "+00:00", "-00:00", "+5:00", "UTC"]),
        st.tuples(st.sampled_from("+-"), _two_digits(25), _two_digits(61)).map(
            lambda z: f"{z[0]}{z[1]}:{z[2]}"
        ),
    ),
).map("".join)


@settings(max_examples=1000, deadline=None)
@given(text=RFC3339_TEXT, foreign=st.booleans())
def test_rfc3339_times_read_as_pythons_datetime_reads_them(text: str, foreign: bool) -> None:
    # Generated times, valid and not (a month 13, a 30th of February, an hour 24, an
    # offset of 24 hours or 60 minutes, a fraction of 10 digits or none, "t", "z",
    # Arabic-Indic digits): the same instant as the reference, or None with it.
    if foreign:
        text = text.translate(str.maketrans("0123456789", "٠١٢٣٤٥٦٧٨٩"))
    at = _rfc3339_by_datetime(text)
    assert parse_rfc3339(text) == at
    wall = 1_445_412_480 * 10**9  # 2015-10-21T07:28:00Z
    for _ in range(2):  # read, then remembered
        assert rfc3339_reset(text, wall) == (
            None if at is None else min(max(at - wall, 0), _MAX_WAIT_NS)
        )


def test_only_short_resets_and_dates_are_remembered() -> None:
    # A hostile server sends a new long reset and a new long Date with every answer:
    # each is refused every time (as before they were remembered), and none is kept.
    _rfc3339_ns.cache_clear()
    _http_date.cache_clear()
    for i in range(100):
        date = f"Wed, 21 Oct 2015 07:28:00 GMT{' ' * 40}{i}"
        answer = anthropic(date, tokens=(10, 5, f"2015-10-21T07:28:05Z{' ' * 50}{i}"))
        assert parse_budgets(answer.get, lambda: 0) == {}
        assert parse_pause({"retry-after": date}.get) is None
    assert _rfc3339_ns.cache_info().currsize == 0
    assert _http_date.cache_info().currsize == 0
    # Short ones are kept, as many as each holds at most
    for i in range(600):
        date = f"Wed, 21 Oct 2015 07:{i // 60 % 60:02d}:{i % 60:02d} GMT"
        answer = anthropic(date, tokens=(10, 5, f"2015-10-21T08:{i // 60 % 60:02d}:{i % 60:02d}Z"))
        assert parse_budgets(answer.get, lambda: 0) == {"tokens": Budget(10, 5, 3600 * 10**9)}
    assert _rfc3339_ns.cache_info().currsize == 256
    assert _http_date.cache_info().currsize == 64


def openai(requests_: tuple[int, int, str], tokens: tuple[int, int, str]) -> dict[str, str]:
    out = {}
    for name, (limit, left, reset) in (("requests", requests_), ("tokens", tokens)):
        out[f"x-ratelimit-limit-{name}"] = str(limit)
        out[f"x-ratelimit-remaining-{name}"] = str(left)
        out[f"x-ratelimit-reset-{name}"] = reset
    return out


def anthropic(wall: str, **budgets: tuple[int, int, str]) -> dict[str, str]:
    out = {"date": wall}
    for arg, (limit, left, reset) in budgets.items():
        name = arg.replace("_", "-")
        out[f"anthropic-ratelimit-{name}-limit"] = str(limit)
        out[f"anthropic-ratelimit-{name}-remaining"] = str(left)
        out[f"anthropic-ratelimit-{name}-reset"] = reset
    return out


def test_every_header_of_the_openai_family() -> None:
    fields = openai((60, 59, "1s"), (150000, 149984, "6m0s"))
    assert parse_budgets(fields.get) == {
        "requests": Budget(60, 59, S),
        "tokens": Budget(150000, 149984, 360 * S),
    }


def test_every_header_of_the_anthropic_family_read_against_the_date() -> None:
    fields = anthropic(
        "Thu, 21 Aug 2025 12:40:58 GMT",
        requests=(50, 49, "2025-08-21T12:40:59Z"),
        tokens=(96000, 95000, "2025-08-21T12:41:00.25Z"),
        input_tokens=(80000, 80000, "2025-08-21T12:40:58Z"),
        output_tokens=(16000, 15000, "2025-08-21T12:40:57Z"),  # past: 0
    )
    assert parse_budgets(fields.get) == {
        "requests": Budget(50, 49, S),
        "tokens": Budget(96000, 95000, 2 * S + S // 4),
        "input-tokens": Budget(80000, 80000, 0),
        "output-tokens": Budget(16000, 15000, 0),
    }
    # Without a Date, the reset is read against the wall clock given (ns since the epoch).
    del fields["date"]
    assert parse_budgets(fields.get, lambda: 1_755_780_059 * S)["tokens"] == Budget(
        96000, 95000, S + S // 4
    )


def test_a_budget_with_a_part_missing_or_unreadable_is_left_out() -> None:
    fields = openai((60, 59, "soon"), (100, 50, "1s"))
    del fields["x-ratelimit-limit-tokens"]
    assert parse_budgets(fields.get) == {}
    assert parse_budgets({"x-ratelimit-limit-requests": "-1", "x-ratelimit-remaining-requests": "1",
                          "x-ratelimit-reset-requests": "1s"}.get) == {}  # fmt: skip


@pytest.mark.parametrize(
    ("limit", "remaining", "budget"),
    [
        ("60", "59", Budget(60, 59, S)),
        (" 60\t", "  59 ", Budget(60, 59, S)),  # blanks around a count (requests keeps them)
        ("60", "61", Budget(60, 60, S)),  # never more left than the limit
        ("9" * 18, "0", Budget(10**18 - 1, 0, S)),
        ("1" + "0" * 18, "0", None),  # 19 digits: not read
        ("６０", "59", None),  # digits of another script
        ("60", "5 9", None),
        ("60", "", None),
        ("+60", "59", None),
    ],
)  # fmt: skip
def test_a_count_is_ascii_digits_alone_and_blanks_around_them(
    limit: str, remaining: str, budget: Budget | None
) -> None:
    fields = {"x-ratelimit-limit-requests": limit, "x-ratelimit-remaining-requests": remaining,
              "x-ratelimit-reset-requests": "1s"}  # fmt: skip
    assert parse_budgets(fields.get) == ({} if budget is None else {"requests": budget})


def test_retry_after_ms_before_retry_after() -> None:
    none: dict[str, str] = {}
    assert parse_pause({"retry-after-ms": "1500.5", "retry-after": "9"}.get) == 1_500_500_000
    assert parse_pause({"retry-after-ms": "x", "retry-after": "9"}.get) == 9 * S
    assert parse_pause(none.get) is None


# --------------------------------------------------------------------------
# The ledger, on an injected clock


def test_a_request_waits_for_the_latest_reset_among_the_budgets_it_lacks(
    clock: ManualClock,
) -> None:
    ledger = Ledger(clock=clock)
    wait, first = ledger.claim("api", {"tokens": 100})
    assert wait == 0 and first is not None
    # 2 requests and 250 tokens left; requests reset in 1 s, tokens in 4 s.
    ledger.answered(first, 200, openai((3, 2, "1s"), (300, 250, "4s")).get)
    assert ledger.claim("api", {"tokens": 200})[0] == 0
    assert ledger.claim("api", {"tokens": 40})[0] == 0  # 1 request, 10 tokens left
    assert ledger.claim("api", {"tokens": 10}) == (S, None)  # requests: 0 left till 1 s
    assert ledger.claim("api", {"tokens": 11}) == (4 * S, None)  # and tokens till 4 s
    assert ledger.claim("api", {"tokens": 11, "requests": 0}) == (4 * S, None)  # tokens lack
    assert ledger.claim("api", {"tokens": 10, "requests": 0})[0] == 0  # both have room
    clock.advance(S)  # requests full again; tokens not yet
    assert ledger.claim("api", {"tokens": 1}) == (3 * S, None)
    assert ledger.claim("api", {"tokens": 0})[0] == 0
    clock.advance(3 * S)
    assert ledger.claim("api", {"tokens": 300})[0] == 0  # all of it, at its reset


def test_a_request_a_later_budget_holds_charges_nothing_in_the_earlier_ones(
    clock: ManualClock,
) -> None:
    ledger = Ledger(clock=clock)
    _, first = ledger.claim("api", {})
    assert first is not None
    # 2 requests and 100 tokens left: requests has room for every claim below.
    ledger.answered(first, 200, openai((10, 2, "1s"), (1000, 100, "4s")).get)
    assert ledger.claim("api", {"tokens": 101}) == (4 * S, None)
    assert ledger.claim("api", {"tokens": 101}) == (4 * S, None)
    _, a = ledger.claim("api", {"tokens": 50})
    _, b = ledger.claim("api", {"tokens": 50})
    assert a is not None and b is not None  # the two requests the server has left
    assert ledger.claim("api", {"tokens": 0}) == (S, None)
    # a's answer: the server has 9 requests and 950 tokens left; b is still out.
    ledger.answered(a, 200, openai((10, 9, "1s"), (1000, 950, "4s")).get)
    for _ in range(8):
        assert ledger.claim("api", {"tokens": 0})[0] == 0
    assert ledger.claim("api", {"tokens": 0}) == (S, None)
    assert ledger.claim("api", {"tokens": 900, "requests": 0})[0] == 0
    assert ledger.claim("api", {"tokens": 1, "requests": 0}) == (4 * S, None)


class TwoPassLedger(Ledger):
    """`Ledger` with its claim as it was written before the one pass: every budget
    looked at (`_due`), then every budget charged."""

    def claim(self, key: Any, costs: Any) -> tuple[int, Charge | None]:
        account = self._account(key)
        if not costs and not account.budgets and not account.paused_until:
            return 0, Charge(account, {})
        with account.lock:
            now = self.clock()
            due = _due(account, costs, now)
            if due > now:
                return min(due - now, _MAX_WAIT_NS), None
            charged = {}
            for name, budget in account.budgets.items():
                need = charged[name] = costs.get(name, 1)
                budget.left -= need
                budget.out += need
            for name, need in costs.items():
                charged.setdefault(name, need)
            return 0, Charge(account, charged)


_COSTS = st.dictionaries(st.sampled_from(["requests", "tokens", "images"]), st.integers(0, 12))
_SAID = st.tuples(st.integers(1, 10), st.integers(0, 12), st.integers(0, 2000))  # reset: ms
_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("advance"), st.integers(0, 3 * S)),
        st.tuples(st.just("claim"), _COSTS),
        st.tuples(st.just("answered"), st.integers(0, 40), st.sampled_from([200, 429]),
                  st.none() | _SAID, st.none() | _SAID),
        st.tuples(st.just("failed"), st.integers(0, 40)),
    ),
    max_size=40,
)  # fmt: skip


@settings(max_examples=400, deadline=None)
@given(first=st.tuples(_SAID, st.none() | _SAID, st.booleans()), steps=_STEPS)
def test_a_claim_in_one_pass_decides_and_charges_as_the_two_passes_did(
    first: tuple[Any, Any, bool], steps: list[tuple[Any, ...]]
) -> None:
    # The same steps on both ledgers: every claim's wait and charge, and every budget
    # after every step, are the same. The first answer announces one budget or both,
    # either first in the ledger.
    said, other, tokens_first = first
    announced = (other, said) if tokens_first else (said, other)
    steps = [("claim", {}), ("answered", 0, 200, *announced), *steps]
    clock = ManualClock()
    ledgers = (Ledger(clock=clock), TwoPassLedger(clock=clock))
    charges: tuple[list[Charge], list[Charge]] = ([], [])
    for step in steps:
        if step[0] == "advance":
            clock.advance(step[1])
            continue
        claimed = []
        for ledger, made in zip(ledgers, charges):
            if step[0] == "claim":
                wait, charge = ledger.claim("api", step[1])
                claimed.append((wait, None if charge is None else charge.costs))
                if charge is not None:
                    made.append(charge)
            elif step[0] == "answered" and made:
                fields = {}
                for name, budget in (("requests", step[3]), ("tokens", step[4])):
                    if budget is not None:
                        limit, left, reset_ms = budget
                        fields[f"x-ratelimit-limit-{name}"] = str(limit)
                        fields[f"x-ratelimit-remaining-{name}"] = str(left)
                        fields[f"x-ratelimit-reset-{name}"] = f"{reset_ms}ms"
                ledger.answered(made.pop(step[1] % len(made)), step[2], fields.get)
            elif step[0] == "failed" and made:
                ledger.failed(made.pop(step[1] % len(made)))
        if claimed:
            assert claimed[0] == claimed[1]
        assert _budgets_of(ledgers[0]) == _budgets_of(ledgers[1])


def _budgets_of(ledger: Ledger) -> tuple[int, dict[str, tuple[Any, ...]]] | None:
    account = ledger._accounts.get("api")
    if account is None:
        return None
    return account.paused_until, {
        name: (b.limit, b.left, b.out, b.reset_at, b.refilled, b.window)
        for name, b in account.budgets.items()
    }


def test_no_estimate_costs_one_of_every_budget_so_an_exhausted_one_holds(
    clock: ManualClock,
) -> None:
    ledger = Ledger(clock=clock)
    _, first = ledger.claim("api", {})
    assert first is not None
    ledger.answered(first, 200, openai((100, 99, "600ms"), (1000, 0, "2s")).get)
    assert ledger.claim("api", {}) == (2 * S, None)
    clock.advance(2 * S)
    assert ledger.claim("api", {})[0] == 0


def test_a_request_larger_than_a_budget_goes_when_it_is_full(clock: ManualClock) -> None:
    ledger = Ledger(clock=clock)
    _, first = ledger.claim("api", {})
    assert first is not None
    ledger.answered(first, 200, openai((10, 10, "0s"), (100, 100, "0s")).get)
    assert ledger.claim("api", {"tokens": 500})[0] == 0
    assert ledger.claim("api", {"tokens": 1})[0] == S  # owed: a second, no window said yet


def test_an_answer_counts_the_requests_still_out_against_the_servers_word(
    clock: ManualClock,
) -> None:
    ledger = Ledger(clock=clock)
    _, a = ledger.claim("api", {})
    assert a is not None
    ledger.answered(a, 200, openai((100, 99, "1s"), (1000, 999, "1s")).get)
    _, b = ledger.claim("api", {"tokens": 300})
    _, c = ledger.claim("api", {"tokens": 300})
    assert b is not None and c is not None
    # b's answer: 699 left at the server; c (300) is still out, so 399 here.
    ledger.answered(b, 200, openai((100, 98, "1s"), (1000, 699, "1s")).get)
    assert ledger.claim("api", {"tokens": 400})[0] > 0
    assert ledger.claim("api", {"tokens": 399})[0] == 0


def test_settle_refunds_or_charges_the_difference_where_no_answer_said(
    clock: ManualClock,
) -> None:
    ledger = Ledger(clock=clock)
    _, a = ledger.claim("api", {})
    assert a is not None
    ledger.answered(a, 200, openai((100, 100, "0s"), (1000, 1000, "0s")).get)
    _, b = ledger.claim("api", {"tokens": 600})
    assert b is not None
    none: dict[str, str] = {}
    ledger.answered(b, 200, none.get, {"tokens": 100})  # 500 given back: 900 left
    assert ledger.claim("api", {"tokens": 901})[0] > 0
    _, c = ledger.claim("api", {"tokens": 100})  # 800 left
    assert c is not None
    ledger.answered(c, 200, none.get, {"tokens": 500})  # 400 more charged: 400 left
    assert ledger.claim("api", {"tokens": 401})[0] > 0
    assert ledger.claim("api", {"tokens": 400})[0] == 0
    # An answer that announces the budget already counts what the server charged
    # (no settle then), less the 400 still out.
    _, d = ledger.claim("api", {"requests": 0, "tokens": 0})
    assert d is not None
    ledger.answered(d, 200, openai((100, 90, "1s"), (1000, 700, "1s")).get, {"tokens": 50})
    assert ledger.claim("api", {"tokens": 301})[0] > 0
    assert ledger.claim("api", {"tokens": 300})[0] == 0


def test_retry_after_pauses_the_key_and_no_answer_past_a_day(clock: ManualClock) -> None:
    ledger = Ledger(clock=clock)
    _, a = ledger.claim("api", {})
    assert a is not None
    ledger.answered(a, 429, {"retry-after-ms": "750"}.get)
    assert ledger.claim("api", {}) == (750 * MS, None)
    _, b = ledger.claim("other", {})
    assert b is not None
    ledger.answered(b, 200, openai((1, 0, "9999h"), (1, 1, "0s")).get)
    assert ledger.claim("other", {}) == (86_400 * S, None)


def test_a_failed_request_gives_its_charge_back(clock: ManualClock) -> None:
    ledger = Ledger(clock=clock)
    _, a = ledger.claim("api", {})
    assert a is not None
    ledger.answered(a, 200, openai((2, 1, "1s"), (10, 9, "1s")).get)
    _, b = ledger.claim("api", {"tokens": 9})
    assert b is not None and ledger.claim("api", {})[0] == S
    ledger.failed(b)
    assert ledger.claim("api", {"tokens": 9})[0] == 0


@pytest.mark.parametrize(
    ("estimate", "error"),
    [
        (lambda r: 5, TypeError), (lambda r: {"tokens": 1.5}, TypeError),
        (lambda r: {"tokens": True}, TypeError), (lambda r: {"tokens": -1}, ValueError),
        (lambda r: {1: 1}, TypeError),
    ],
)  # fmt: skip
def test_a_bad_estimate_is_a_clear_error(estimate: Any, error: type[Exception]) -> None:
    api = httpx.MockTransport(lambda r: httpx.Response(200))
    t = RateLimitedTransport(api, rate=10, capacity=10, estimate=estimate)
    with pytest.raises(error):
        httpx.Client(transport=t).get("http://api/")
    with pytest.raises(TypeError, match="estimate must be a callable"):
        RateLimitedTransport(rate=10, capacity=10, estimate=5)  # type: ignore[arg-type]


# --------------------------------------------------------------------------
# Through the clients, with a clock the sleeps move


def sleeper(clock: ManualClock, slept: list[float]) -> Any:
    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(round(seconds * S))

    return sleep


def provider(clock: ManualClock, sent: list[int]) -> Any:
    """3 requests and 300 tokens a second, both reset together at each whole second."""
    state = {"window": -1, "requests": 0, "tokens": 0}

    def handler(request: httpx.Request) -> httpx.Response:
        window = clock() // S
        if window != state["window"]:
            state.update(window=window, requests=3, tokens=300)
        want = json.loads(request.content)["tokens"]
        reset = f"{(window + 1) * S - clock()}ns"
        status = 200
        if state["requests"] < 1 or state["tokens"] < want:
            status = 429
        else:
            state["requests"] -= 1
            state["tokens"] -= want
            sent.append(clock())
        headers = openai((3, state["requests"], reset), (300, state["tokens"], reset))
        return httpx.Response(status, headers=headers, json={"usage": {"total_tokens": want}})

    return handler


def test_httpx_paces_by_requests_and_tokens_together(impl: ModuleType, clock: ManualClock) -> None:
    sent: list[int] = []
    slept: list[float] = []
    t = RateLimitedTransport(
        httpx.MockTransport(provider(clock, sent)), rate=1000, capacity=100, clock=clock,
        sleep=sleeper(clock, slept), estimate=lambda r: json.loads(r.content),
    )  # fmt: skip
    client = httpx.Client(transport=t)
    statuses = [
        client.post("http://api/", json={"tokens": n}).status_code
        for n in (100, 150, 100, 10, 10, 10, 290)
    ]
    assert statuses == [200] * 7
    # 100 + 150, then 100 lacks tokens: the next second, with 10 and 10 (its 3
    # requests); then 10 and 290 (all 300 tokens) the second after.
    assert sent == [0, 0, S, S, S, 2 * S, 2 * S]


def test_requests_paces_by_both_budgets_with_settle(impl: ModuleType, clock: ManualClock) -> None:
    sent: list[int] = []
    slept: list[float] = []
    Limited = _canned_adapter(provider(clock, sent))
    settled: list[int] = []

    def settle(response: requests.Response) -> dict[str, int]:
        settled.append(response.json()["usage"]["total_tokens"])
        return {"tokens": settled[-1]}

    session = requests.Session()
    session.mount("http://", Limited(
        rate=1000, capacity=100, clock=clock, sleep=sleeper(clock, slept),
        estimate=lambda r: json.loads(r.body), settle=settle,
    ))  # fmt: skip
    statuses = [session.post("http://api/", json={"tokens": n}).status_code for n in (200, 200)]
    assert statuses == [200, 200]
    assert sent == [0, S] and slept == [1.0] and settled == [200, 200]


def test_the_asyncio_transport_waits_for_the_budget_and_awaits_settle(
    impl: ModuleType, clock: ManualClock
) -> None:
    sent: list[int] = []
    slept: list[float] = []

    async def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.advance(round(seconds * S))

    async def settle(response: httpx.Response) -> dict[str, int]:
        await response.aread()
        return {"tokens": response.json()["usage"]["total_tokens"]}

    async def main() -> list[int]:
        t = AsyncRateLimitedTransport(
            httpx.MockTransport(provider(clock, sent)), rate=1000, capacity=100, clock=clock,
            async_sleep=sleep, estimate=lambda r: json.loads(r.content), settle=settle,
        )  # fmt: skip
        async with httpx.AsyncClient(transport=t) as client:
            return [
                (await client.post("http://api/", json={"tokens": 200})).status_code
                for _ in range(3)
            ]

    assert asyncio.run(main()) == [200, 200, 200]
    assert sent == [0, S, 2 * S] and slept == [1.0, 1.0]


def _canned_adapter(handler: Any) -> type[RateLimitedAdapter]:
    """A `RateLimitedAdapter` over an adapter that answers by *handler* (an httpx one)."""

    class Canned(requests.adapters.HTTPAdapter):
        def send(self, request: Any, *args: Any, **kwargs: Any) -> requests.Response:
            answer = handler(httpx.Request("POST", request.url, content=request.body))
            response = requests.Response()
            response.status_code = answer.status_code
            response.headers.update(answer.headers)
            response._content = answer.content
            return response

    class Limited(RateLimitedAdapter, Canned):
        pass

    return Limited


@pytest.mark.parametrize("client", ["httpx", "httpx-async", "requests"])
def test_with_no_estimate_the_budgets_an_answer_announces_hold_the_next_requests(
    impl: ModuleType, clock: ManualClock, client: str
) -> None:
    # No estimate and no settle: a key no budget was heard of goes past the budgets.
    # Its first answer announces nothing; the next, read once for the pacing and the
    # budgets, announces 3 requests a second. Each request then costs one: the
    # fourth of those waits for the reset.
    sent: list[int] = []
    slept: list[float] = []
    answers = provider(clock, sent)

    def handler(request: httpx.Request) -> httpx.Response:
        return answers(request) if request.url.path == "/" else httpx.Response(200)

    requests_ = ["http://api/first"] + ["http://api/"] * 5
    keywords: dict[str, Any] = {"rate": 1000, "capacity": 100, "clock": clock}
    if client == "httpx":
        keywords["sleep"] = sleeper(clock, slept)
        with httpx.Client(transport=RateLimitedTransport(
            httpx.MockTransport(handler), **keywords
        )) as c:  # fmt: skip
            statuses = [c.post(url, json={"tokens": 10}).status_code for url in requests_]
    elif client == "httpx-async":
        moved = sleeper(clock, slept)

        async def sleep(seconds: float) -> None:
            moved(seconds)

        async def main() -> list[int]:
            t = AsyncRateLimitedTransport(
                httpx.MockTransport(handler), async_sleep=sleep, **keywords
            )
            async with httpx.AsyncClient(transport=t) as c:
                return [(await c.post(url, json={"tokens": 10})).status_code for url in requests_]

        statuses = asyncio.run(main())
    else:
        session = requests.Session()
        session.mount("http://", _canned_adapter(handler)(sleep=sleeper(clock, slept), **keywords))
        statuses = [session.post(url, json={"tokens": 10}).status_code for url in requests_]
    assert statuses == [200] * 6
    assert sent == [0, 0, 0, S, S] and slept == [1.0]


def test_a_budget_wait_past_the_timeout_raises_and_sends_nothing(
    impl: ModuleType, clock: ManualClock
) -> None:
    sent: list[int] = []
    t = RateLimitedTransport(
        httpx.MockTransport(provider(clock, sent)), rate=1000, capacity=100, clock=clock,
        timeout=0.5, sleep=sleeper(clock, []), estimate=lambda r: json.loads(r.content),
    )  # fmt: skip
    client = httpx.Client(transport=t)
    assert client.post("http://api/", json={"tokens": 300}).status_code == 200
    with pytest.raises(RateLimitTimeout) as caught:
        client.post("http://api/", json={"tokens": 1})
    assert caught.value.retry_after_ns == S and sent == [0]


def test_shared_budgets_space_the_processes_by_each_budgets_refill(
    impl: ModuleType, clock: ManualClock
) -> None:
    # 600 tokens and 60 requests refilled in 2 s, as the answers' resets say: a token
    # is worth 3.33 ms of the shared limiter's time (1 ms a token), a request 33.3 ms.
    store = nb.KeyedTokenBucket(rate=1000, capacity=400, clock=clock)
    fields = openai((60, 59, "33334us"), (600, 540, "200ms"))
    slept: list[float] = []

    def process() -> httpx.Client:
        api = httpx.MockTransport(
            lambda r: httpx.Response(200, headers=fields, json={"usage": {"total_tokens": 50}})
        )
        return httpx.Client(transport=RateLimitedTransport(
            api, rate=1000, capacity=100, clock=clock, sleep=sleeper(clock, slept),
            estimate=lambda r: {"tokens": 60}, shared=store,
            settle=lambda r: {"tokens": json.loads(r.read())["usage"]["total_tokens"]},
        ))  # fmt: skip

    a, b = process(), process()
    a.get("http://api/")  # nothing sized yet: nothing shared
    b.get("http://api/")
    assert store.tokens_at("api|budget:tokens", clock()) == 400
    a.get("http://api/")  # 60 tokens: 200 shared, 50 spent: 167, so 33 back
    assert store.tokens_at("api|budget:tokens", clock()) == 400 - 167
    assert store.tokens_at("api|budget:requests", clock()) == 400 - 34
    b.get("http://api/")  # its slot starts once a's 167 are spent
    # Each request also takes its key's own shared token first (1 ms apart): b's
    # second at 3 ms, and its tokens' slot at 2 + 167 ms.
    assert slept == [0.001, 0.001, 0.001, 0.166]


@settings(max_examples=300, deadline=None)
@given(
    minutes=st.sampled_from(["", "0m", "6m", "999999m", "1234567m", "١m"]),
    whole=st.sampled_from(["0", "12", "999999999", "1234567890", "٣"]),
    decimals=st.sampled_from(["", ".", ".5", ".045", ".000000001", ".999999999", ".1234567891"]),
    unit=st.sampled_from(["s", "ms", "us", "m"]),
)
def test_the_usual_go_durations_read_as_go_reads_them(
    minutes: str, whole: str, decimals: str, unit: str
) -> None:
    text = minutes + whole + decimals + unit
    assert parse_go_duration(text) == _go_duration_for_a_reset(text)
