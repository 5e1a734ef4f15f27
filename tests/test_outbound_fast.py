"""The outbound clients' quick paths read and decide exactly as the general ones.

Most answers carry no limit field, and an answer that does usually says what
the last one said: the adapters look for the fields in one pass over their
HTTP client's own header list, a key whose server never said anything is
counted without a lock (bare), and the same IETF texts are not parsed
twice. Each is checked here against the general reading it stands for:
string by string (hypothesis), and request by request on a clock that only
the injected sleep moves.
"""

from __future__ import annotations

import math
from typing import Any

import httpx
import pytest
import requests.structures
from hypothesis import example, given, settings
from hypothesis import strategies as st

from nanobucket import httpx as nb_httpx
from nanobucket import requests as nb_requests
from nanobucket._outbound import budgets as _budgets
from nanobucket._outbound import fields as _fields
from nanobucket._outbound import pacer as _outbound
from nanobucket._outbound.budget_fields import (
    BUDGET_FIELDS,
    FAMILIES,
    parse_budgets,
    parse_pause,
)
from nanobucket._outbound.fields import (
    FIELDS,
    TRIGGERS,
    _first_int,
    _items,
    _split,
    _split_escaped,
    _states,
    _whole,
    fields_of,
    parse_limits,
)
from nanobucket.httpx import RateLimitedTransport
from nanobucket.httpx import limit_fields as httpx_fields
from nanobucket.requests import limit_fields as requests_fields

from conftest import SleepClock

NS = 1_000_000_000

# Text made of what the fields' grammar turns on.
GRAMMAR = st.text(alphabet='"\\;,= ar1t09.q-w5x_', max_size=40)
STATE = st.builds(
    lambda name, r, t, tail: f'"{name}";r={r};t={t}{tail}',
    st.text(alphabet='ab,;"\\ ', max_size=6),
    st.sampled_from(["0", "7", "007", "1" * 15, "1" * 16, "１", "2.0", "", "-1"]),
    st.sampled_from(["1", "60", "9" * 15, "x"]),
    st.sampled_from(["", ",", ', "b";r=1;t=2', ";w=1", " "]),
)


@settings(max_examples=400, deadline=None)
@given(text=GRAMMAR, sep=st.sampled_from([",", ";"]))
def test_split_without_escapes_is_the_character_scan(text: str, sep: str) -> None:
    assert _split(text, sep) == _split_escaped(text, sep)


@settings(max_examples=400, deadline=None)
@given(text=st.one_of(GRAMMAR, STATE))
def test_the_usual_ratelimit_field_reads_as_the_general_parser(text: str) -> None:
    assert _states(text) == [(item, p) for item, p in _items(text) if "r" in p]


@settings(max_examples=400, deadline=None)
@given(first=STATE, then=st.one_of(STATE, GRAMMAR))
def test_another_remaining_of_the_same_form_is_what_the_parser_reads(first: str, then: str) -> None:
    prefix = _fields.one_state(first)
    if prefix is None:
        return
    (name, _), *_ = _states(first)
    remaining = _fields.remaining_after(prefix, then)
    if remaining is not None:  # then it names the same policy, and only it
        assert _states(then) == [(name, {"r": remaining, "t": _states(then)[0][1]["t"]})]


def _whole_reference(text: str) -> int | None:
    value = _fields._number(text)
    return value.numerator if value is not None and value.denominator == 1 else None


@settings(max_examples=300, deadline=None)
@given(text=st.one_of(st.text(alphabet=" 0123456789.１x", max_size=20), GRAMMAR))
def test_whole_numbers_read_as_exact_fractions_do(text: str) -> None:
    assert _whole(text) == _whole_reference(text)
    items = _items(text)
    expected = items[0][0] if items and isinstance(items[0][0], int) else None
    assert _first_int(text) == expected


HEADER_NAMES = st.sampled_from(
    [*sorted(FIELDS), "RateLimit", "Retry-After", "X-RateLimit-Remaining", "Date", "Server"]
)
HEADER_VALUES = st.sampled_from(["1", '"p";r=2;t=1', '"p";q=5;w=1', "nö", "a, b", ""])


@settings(max_examples=300, deadline=None)
@given(headers=st.lists(st.tuples(HEADER_NAMES, HEADER_VALUES), max_size=8))
def test_the_adapters_find_the_fields_httpx_and_requests_give(
    headers: list[tuple[str, str]],
) -> None:
    h = httpx.Headers([(name.encode(), value.encode()) for name, value in headers])  # UTF-8
    expected = {name: h[name] for name in FIELDS if name in h}
    triggered = not TRIGGERS.isdisjoint(expected)
    assert httpx_fields(h) == (expected if triggered else None)
    assert fields_of(h) == (expected if triggered else None)
    r: requests.structures.CaseInsensitiveDict[str] = requests.structures.CaseInsensitiveDict()
    for name, value in headers:  # as urllib3 hands them to requests: repeats joined
        r[name] = f"{r[name]}, {value}" if name in r else value
    wanted = {name: r[name] for name in FIELDS if name in r}
    assert requests_fields(r) == (wanted if not TRIGGERS.isdisjoint(wanted) else None)


def test_the_same_texts_are_the_same_announcement() -> None:
    fields = {"ratelimit-policy": '"p";q=50;w=1', "ratelimit": '"p";r=9;t=1'}
    first = parse_limits(fields.get)
    assert parse_limits(dict(fields).get) is first
    assert _fields.told(*fields.values()) is first
    # With Date or X-RateLimit-* consulted, nothing is remembered.
    epoch = {"ratelimit": '"p";r=9;t=1445412540', "date": "Wed, 21 Oct 2015 07:28:00 GMT"}
    parse_limits(epoch.get)
    assert _fields.told(None, epoch["ratelimit"]) is None


LEGACY_NAMES = st.sampled_from(
    [f"{p}ratelimit-{n}" for p in ("x-", "", "x-") for n in ("limit", "remaining", "reset")]
    + ["ratelimit-policy", "ratelimit", "date"]
)
LEGACY_VALUES = st.sampled_from(
    [
        *("0", "7", "1000", "007", "1" * 16, "1.5", "", " 5", "１", "100, 100;w=60", "x"),
        *("1445412540", '"p";q=5;w=1', '"p";r=2;t=1', "Wed, 21 Oct 2015 07:28:00 GMT"),
    ]
)


@settings(max_examples=400, deadline=None)
@given(
    said=st.tuples(LEGACY_VALUES, LEGACY_VALUES, LEGACY_VALUES),
    more=st.dictionaries(LEGACY_NAMES, LEGACY_VALUES, max_size=2),
    changes=st.dictionaries(LEGACY_NAMES, LEGACY_VALUES, max_size=2),
    dropped=st.lists(LEGACY_NAMES, max_size=1),
    dates=st.tuples(st.booleans(), st.booleans()),
)
@example(said=("5", "3", "1445412540"), more={}, changes={}, dropped=[], dates=(True, False))
def test_an_x_ratelimit_answer_after_another_reads_as_anew(
    said: tuple[str, str, str],
    more: dict[str, str],
    changes: dict[str, str],
    dropped: list[str],
    dates: tuple[bool, bool],
) -> None:
    first = {**dict(zip(_fields._X, said, strict=True)), **more}
    then = {name: v for name, v in {**first, **changes}.items() if name not in dropped}
    for answer, dated in zip((first, then), dates, strict=True):  # a Unix-time reset reads it
        answer.pop("date", None)
        if dated:
            answer["date"] = "Wed, 21 Oct 2015 07:28:00 GMT"
    wall = lambda: 1445412500 * NS  # noqa: E731
    _fields._LEGACY.clear()
    expected = parse_limits(then.get, wall)
    _fields._LEGACY.clear()
    parse_limits(first.get, wall)
    assert parse_limits(then.get, wall) == expected


class _Forgetful(dict[Any, Any]):
    """A cache that keeps nothing."""

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


@settings(max_examples=40, deadline=None)
@given(
    remaining=st.lists(st.sampled_from([0, 1, 2, 3, 40, 39, 1000]), min_size=1, max_size=30),
    reset=st.sampled_from(["0", "1", "60"]),
)
def test_x_ratelimit_answers_that_change_their_remaining_pace_as_if_read_anew(
    remaining: list[int], reset: str
) -> None:
    answers = [
        {"X-RateLimit-Limit": "50", "X-RateLimit-Remaining": str(r), "X-RateLimit-Reset": reset}
        for r in remaining
    ]
    quick = _run(answers, timeout=None)
    with pytest.MonkeyPatch.context() as mp:  # nothing remembered: every answer read anew
        mp.setattr(_fields, "_LEGACY", _Forgetful())
        assert _run(answers, timeout=None) == quick


def _run(answers: list[dict[str, str]], **kwargs: Any) -> list[tuple[int, float]]:
    clock = SleepClock()
    replies = iter(answers)

    def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, headers=next(replies))

    t = RateLimitedTransport(
        httpx.MockTransport(handler), rate=500, capacity=50, clock=clock, sleep=clock.sleep,
        **kwargs,
    )  # fmt: skip
    out = []
    with httpx.Client(transport=t) as client:
        for _ in answers:
            client.get("http://h/")
            state = t.pacer._keys["h"]
            out.append((clock.now, state.bucket.tokens_at(clock.now)))
    return out


@settings(max_examples=40, deadline=None)
@given(
    remaining=st.lists(st.sampled_from([0, 1, 2, 3, 40, 39, 1000]), min_size=1, max_size=30),
    quota=st.sampled_from([10, 50, 1000]),
)
def test_answers_that_repeat_themselves_pace_as_if_read_anew(
    remaining: list[int], quota: int
) -> None:
    answers = [
        {"RateLimit-Policy": f'"p";q={quota};w=1', "RateLimit": f'"p";r={r};t=1'} for r in remaining
    ]
    quick = _run(answers)
    with pytest.MonkeyPatch.context() as mp:  # nothing remembered: every answer read anew
        mp.setattr(_fields, "_CACHED_LEN", -1)
        mp.setattr(_outbound, "told", lambda *texts: None)
        _fields._SAID.clear()
        assert _run(answers) == quick


def test_bare_requests_out_count_against_the_window_announced() -> None:
    # One request starts the key; seven more leave bare (no field heard yet:
    # counted without a lock). The first answer announces 50 per second: the
    # bucket owes the eight of them less its burst of 2, so the next waits
    # 7 tokens at 48/s, as when all eight were counted one by one.
    clock = SleepClock()
    pacer = RateLimitedTransport(rate=500, capacity=50, clock=clock).pacer
    first = pacer.start("h")
    bare = [pacer.take("h") for _ in range(7)]
    assert all(ticket is not None and ticket[1] < 0 for ticket in bare)
    fields = {"ratelimit-policy": '"p";q=50;w=1', "ratelimit": '"p";r=49;t=1'}
    pacer.done(first, 200, fields.get)
    state = pacer._keys["h"]
    assert not state.bare
    assert state.bucket.peek().retry_after_ns == 7 * (NS // 48 + 1)
    for ticket in bare:
        assert ticket is not None
        pacer.done(ticket, 200, {**fields, "ratelimit": '"p";r=42;t=1'}.get)
    assert (state.inflight, _outbound._fold(state), state.refill.admitted) == (0, 0, 8)
    assert not state.bare_open  # none out, none to come: the counters are no longer read


def test_a_bare_request_that_fails_is_no_longer_out() -> None:
    clock = SleepClock()
    pacer = RateLimitedTransport(rate=500, capacity=50, clock=clock).pacer
    nothing: dict[str, str] = {}
    pacer.done(pacer.start("h"), 200, nothing.get)
    ticket = pacer.take("h")
    assert ticket is not None and ticket[1] < 0
    pacer.failed(ticket)
    plain = pacer.take("h")
    assert plain is not None and pacer.plain(plain)
    state = pacer._keys["h"]
    assert _outbound._fold(state) == 0 and state.refill.admitted == 2


def _raise_by_a_probe_of_cost_0(bucket: Any, at: int, least: int) -> None:
    """`_outbound._raise` as it read the bucket's debt before: a peek of cost 0."""
    capacity = bucket.capacity
    free = capacity - bucket.peek_at(at, 0).reset_after_ns / bucket.interval_ns
    lack = min(math.floor(least - free), least, capacity)
    if lack > 0:
        bucket.refund_at(at, lack)


@settings(max_examples=200, deadline=None)
@given(
    rate=st.sampled_from([1, 3, 7, 1000, 10**6, 10**9]),
    capacity=st.integers(1, 40),
    spent=st.integers(0, 100),
    at=st.sampled_from([0, 1, 10**6, 333_333_333, 10**9, 3 * 10**9]),
    least=st.integers(-3, 50),
)
def test_raise_gives_back_what_a_probe_of_cost_0_says_is_lacking(
    impl: Any, rate: int, capacity: int, spent: int, at: int, least: int
) -> None:
    quick, reference = (impl.TokenBucket(rate, capacity) for _ in "ab")
    for bucket in (quick, reference):  # spent past empty too: callers waiting in line
        for _ in range(spent):
            bucket.reserve(cost=1, max_wait_ns=10**15, now=0)
    _outbound._raise(quick, at, least)
    _raise_by_a_probe_of_cost_0(reference, at, least)
    assert quick.peek_at(at, 0).reset_after_ns == reference.peek_at(at, 0).reset_after_ns


# Answers of every family, the budgets' among them, and ones with none.
_FAMILIES = [
    {},
    {"Server": "x"},
    {"RateLimit-Policy": '"p";q=50;w=1', "RateLimit": '"p";r=3;t=1'},
    {"X-RateLimit-Limit": "50", "X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1"},
    {"X-RateLimit-Used": "3"},
    {
        "x-ratelimit-limit-requests": "5",
        "x-ratelimit-remaining-requests": "0",
        "x-ratelimit-reset-requests": "1.5s",
    },
    {
        "X-RateLimit-Limit-Tokens": "300",
        "X-RateLimit-Remaining-Tokens": "120",
        "X-RateLimit-Reset-Tokens": "2s",
    },
    {
        "anthropic-ratelimit-requests-limit": "4",
        "anthropic-ratelimit-requests-remaining": "0",
        "anthropic-ratelimit-requests-reset": "2015-10-21T07:28:02Z",
    },
    {"Retry-After": "2"},
    {"retry-after-ms": "700", "Retry-After": "1"},
]


class _GeneralReading(RateLimitedTransport):
    """The transport, every answer's names taken to announce a budget (the general path)."""

    def _read(self, headers: Any) -> tuple[Any, None, dict[str, str] | None]:
        return headers.get, None, self._fields(headers)


def _budgets_run(
    answers: list[tuple[int, int]], kind: type[RateLimitedTransport], **kwargs: Any
) -> list[Any]:
    clock = SleepClock()
    replies = iter(answers)

    def handler(request: httpx.Request) -> httpx.Response:
        status, family = next(replies)
        return httpx.Response(status, headers=_FAMILIES[family])

    t = kind(
        httpx.MockTransport(handler), rate=500, capacity=50, clock=clock, sleep=clock.sleep,
        wall_clock=lambda: 1445412480 * NS + clock.now, timeout=None, **kwargs,
    )  # fmt: skip
    out: list[Any] = []
    with httpx.Client(transport=t) as client:
        for _ in answers:
            client.get("http://h/")
            account = t._ledger._accounts["h"]
            budgets = {
                name: (b.limit, b.left, b.out, b.reset_at, b.window)
                for name, b in account.budgets.items()
            }
            out.append((clock.now, t.limit("h"), account.paused_until, budgets))
    return out


@settings(max_examples=60, deadline=None)
@given(
    answers=st.lists(
        st.tuples(st.sampled_from([200, 200, 429, 503]), st.integers(0, len(_FAMILIES) - 1)),
        min_size=1,
        max_size=12,
    ),
    estimated=st.booleans(),
)
@example(answers=[(200, 2), (200, 5), (200, 0), (200, 3)], estimated=False)
def test_answers_that_announce_no_budget_skip_the_ledger_as_the_general_path_would(
    answers: list[tuple[int, int]], estimated: bool
) -> None:
    kwargs: dict[str, Any] = {"estimate": lambda request: {"tokens": 40}} if estimated else {}
    quick = _budgets_run(answers, RateLimitedTransport, **kwargs)
    assert _budgets_run(answers, _GeneralReading, **kwargs) == quick


_BUDGET_NAMES = st.sampled_from(
    [*sorted(BUDGET_FIELDS | FIELDS), "x-ratelimit-limit-other", "Server", "Date"]
).flatmap(lambda name: st.sampled_from([name, name.upper(), name.title()]))
_BUDGET_VALUES = st.sampled_from([b"1", b"0", b"1.5s", b"", b"n\xc3\xb6", b"\xff"])


@settings(max_examples=400, deadline=None)
@given(headers=st.lists(st.tuples(_BUDGET_NAMES, _BUDGET_VALUES), max_size=8))
@example(headers=[("X-RateLimit-Limit-Tokens", b"5"), ("x-ratelimit-limit-tokens", b"6")])
@example(headers=[("X-RateLimit-Limit-Tokens", b"5"), ("Retry-After-Ms", b"\xff")])
def test_the_adapters_read_every_budget_field_as_the_clients_own_get(
    headers: list[tuple[str, bytes]],
) -> None:
    announced = any(name.lower() in _budgets._ANNOUNCING for name, _ in headers)
    h = httpx.Headers([(name.encode("ascii"), value) for name, value in headers])
    get, budgets, fields = nb_httpx._read_answer(h)
    assert fields == fields_of(h)  # the general reading, by httpx's own get
    assert get is not None or not announced
    if get is not None:
        _assert_read_as_httpx_reads(h, get, budgets)
    r: requests.structures.CaseInsensitiveDict[str] = requests.structures.CaseInsensitiveDict()
    for name, value in headers:
        r[name] = value.decode("latin-1")
    get, budgets, fields = nb_requests._read_answer(r)
    assert budgets is None
    assert fields == requests_fields(r)
    assert get is not None or not any(name in _budgets._ANNOUNCING for name, _ in r.lower_items())


# Each budget's (limit, remaining, reset) names, OpenAI-style then Anthropic-style
_TRIPLES = [names[:3] for family, _ in FAMILIES for names in family]
_ANTHROPIC_RESETS = {
    names[2] for family, go_resets in FAMILIES if not go_resets for names in family
}
_BESIDES = BUDGET_FIELDS - {name for triple in _TRIPLES for name in triple}


def _assert_read_as_httpx_reads(h: httpx.Headers, get: Any, budgets: Any) -> None:
    """What the budgets read by *get* and *budgets* (`_read_answer`'s) is what they read
    by httpx's own ``Headers.get``: every field, or the budgets read already and the
    fields besides theirs."""
    wall = lambda: 1_800_000_000 * 10**9  # noqa: E731
    assert parse_pause(get, wall) == parse_pause(h.get, wall)
    if budgets is None:
        assert {name: get(name) for name in BUDGET_FIELDS} == {
            name: h.get(name) for name in BUDGET_FIELDS
        }
    else:
        assert budgets == parse_budgets(h.get, wall)
        assert {name: get(name) for name in _BESIDES} == {name: h.get(name) for name in _BESIDES}


# Counts, resets and dates as providers send them, and as they may not: blanks, signs,
# other scripts' digits, 19 digits, Go's other forms, offsets, bytes that are not ASCII.
_ODD = [
    b"0",
    b" 7",
    b"7 ",
    b"007",
    b"",
    b"1" * 18,
    b"1" * 19,
    b"\xef\xbc\x95",
    b"n\xc3\xb6",
    b"\xff",
    b"x" * 70,
]
_GO = [b"12ms", b"6m0s", b"1.5s", b"+340ms", b"-1s", b"1h", b"2.5us", b"0"]
_RFC3339 = [
    b"2015-10-21T07:28:05Z",
    b"2015-10-21T07:27:00Z",
    b"2015-10-21T08:28:01.5+01:00",
    b"2015-10-21T07:28:05",
    b"2015-10-21T07:28:05Z" + b" " * 50,
]
_DATES = [
    b"Wed, 21 Oct 2015 07:28:00 GMT",
    b"Wed, 21 Oct 2015 07:28:00 -0000",
    b"yesterday",
    b"Wed, 21 Oct 2015 07:28:00 GMT" + b" " * 40,
]
_COUNTS = st.one_of(
    st.integers(0, 10**6).map(lambda n: str(n).encode("ascii")), st.sampled_from(_ODD)
)
_VALUES = st.one_of(_COUNTS, st.sampled_from(_GO + _RFC3339 + _DATES))


@st.composite
def _provider_answers(draw: Any) -> list[tuple[str, bytes]]:
    """An answer's fields in some order: some budgets' three, some other fields."""
    fields: dict[str, bytes] = {}
    for limit, remaining, reset in draw(
        st.lists(st.sampled_from(_TRIPLES), unique=True, max_size=4)
    ):
        fields[limit], fields[remaining] = draw(_COUNTS), draw(_COUNTS)
        usual = _RFC3339[:3] if reset in _ANTHROPIC_RESETS else _GO
        fields[reset] = draw(st.one_of(st.sampled_from(usual), _VALUES))
    if draw(st.booleans()):
        fields["date"] = draw(st.one_of(st.sampled_from(_DATES[:2]), _VALUES))
    others = st.sampled_from([*sorted(BUDGET_FIELDS), "server"])
    for name, value in draw(st.lists(st.tuples(others, _VALUES), max_size=3)):
        fields.setdefault(name, value)
    shuffled: list[tuple[str, bytes]] = draw(st.permutations(list(fields.items())))
    return shuffled


@settings(max_examples=600, deadline=None)
@given(answers=st.lists(_provider_answers(), min_size=1, max_size=3), case=st.sampled_from(
    [str.lower, str.upper, str.title]
))  # fmt: skip
@example(
    answers=[[(name, b"5") for triple in _TRIPLES for name in triple[:2]]
             + [(triple[2], b"12ms") for triple in _TRIPLES[:2]]
             + [(triple[2], b"2015-10-21T07:28:05Z") for triple in _TRIPLES[2:]]
             + [("date", b"Wed, 21 Oct 2015 07:28:00 GMT")]],
    case=str.title,
)  # fmt: skip
def test_budgets_read_at_their_places_as_httpx_reads_them(
    answers: list[list[tuple[str, bytes]]], case: Any
) -> None:
    # Differential: the budgets httpx's answers announce, read by the places of their
    # fields in the header list (remembered by the names: later answers with the same
    # names and other values read by them), and read by httpx's own Headers.get.
    for answer in answers:
        sent = dict(answer)
        complete = [t for t in _TRIPLES if all(name in sent for name in t)]
        # The usual answer is read at the places: every field read ASCII, the counts
        # ASCII digits alone, a Date read for RFC 3339 resets
        usual = (
            all(value.isascii() for name, value in answer if name != "server")
            and all(sent[n].isdigit() and len(sent[n]) <= 18 for t in complete for n in t[:2])
            and (
                not any(t[2] in _ANTHROPIC_RESETS for t in complete)
                or sent.get("date") in _DATES[:2]
            )
        )
        for _ in range(2):  # the second time, by the names' remembered places
            h = httpx.Headers([(case(name).encode("ascii"), value) for name, value in answer])
            get, budgets, _ = nb_httpx._read_answer(h)
            if get is None:  # no limit of a budget: nothing announced
                assert parse_budgets(h.get) == {}
                assert not any(name in _budgets._ANNOUNCING for name, _ in answer)
                continue
            _assert_read_as_httpx_reads(h, get, budgets)
            assert budgets is not None or not usual


@pytest.mark.parametrize(
    "names",
    [
        [b"Server", b"RateLimit", b"Date", b"X-RateLimit-Limit-Tokens"],  # a budget's
        [b"Server", b"X-RateLimit-Remaining", b"Date", b"X-RateLimit-Limit"],
        [b"RateLimit", b"Date", b"ratelimit", b"Server"],  # one sent twice
    ],
)
def test_names_read_before_are_read_again_as_the_clients_own_get_whatever_the_values(
    names: list[bytes],
) -> None:
    # The first answer's names are remembered where its fields are; the next ones,
    # with the same names, have other values (one of them not ASCII).
    for values in (
        [b"x", b"1", b"now", b"5"],
        [b"y", b"0", b"\xff", b"6"],
        [b"\xe9", b"2", b"a", b"7"],
    ):
        h = httpx.Headers(list(zip(names, values)))
        get, budgets, fields = nb_httpx._read_answer(h)
        assert fields == fields_of(h)  # the general reading, by httpx's own get
        if get is not None:
            _assert_read_as_httpx_reads(h, get, budgets)
        assert (get is not None) == (b"X-RateLimit-Limit-Tokens" in names)


def test_names_that_hold_a_line_break_are_not_read_by_the_places_of_others() -> None:
    # Both lists join to the names of the first, read before, and hold no field: read by
    # its places, they would say a RateLimit of "2".
    plain = httpx.Headers([(b"Date", b"1"), (b"RateLimit", b'"d";r=1;t=1'), (b"X", b"2")])
    assert nb_httpx._read_answer(plain) == (
        None,
        None,
        {"date": "1", "ratelimit": '"d";r=1;t=1'},
    )
    for raw in (
        [(b"Date\nRateLimit", b'"d";r=1;t=1'), (b"X", b"2")],
        [(b"Date", b"1"), (b"RateLimit\nX", b"2")],
    ):
        h = httpx.Headers(raw)
        assert nb_httpx._read_answer(h) == (None, None, None)
        assert httpx_fields(h) is None


def test_every_announcing_field_holds_a_mark_the_adapters_look_for() -> None:
    assert all(
        any(mark in name for mark in _budgets.ANNOUNCING_MARKS) for name in _budgets._ANNOUNCING
    )
    assert set(_budgets._ANNOUNCING) <= BUDGET_FIELDS


def test_the_budgets_read_no_field_but_the_budget_fields() -> None:
    asked: list[str] = []

    def get(name: str) -> str | None:
        asked.append(name)
        return {"x-ratelimit-limit-tokens": "5", "anthropic-ratelimit-tokens-limit": "5"}.get(name)

    ledger = _budgets.Ledger(clock=lambda: 0, wall_clock=lambda: 0)
    charge = ledger.claim("h", {"tokens": 1})[1]
    assert charge is not None
    ledger.answered(charge, 429, get, {"tokens": 2})
    assert set(asked) <= BUDGET_FIELDS and "retry-after-ms" in asked
