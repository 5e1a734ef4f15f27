"""The outbound adapters read httpx and requests through their public API only.

The key of a request (its host and port) and the limit fields of an answer
are read from ``URL.host`` / ``URL.port``, ``Headers.raw`` and
``CaseInsensitiveDict.lower_items()``. Each reading is checked against the
one it replaced, which reached into the clients' private attributes and is
kept here as the reference: the same key for every URL, the same fields for
every header list (hypothesis). A scan of the adapters' source proves that
no private attribute of either client is named there.
"""

from __future__ import annotations

import ast
import string
from collections.abc import Mapping
from operator import itemgetter
from pathlib import Path
from typing import Any

import httpx
import pytest
import requests
import requests.adapters
import requests.structures
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

import nanobucket
from nanobucket import httpx as nb_httpx
from nanobucket import requests as nb_requests
from nanobucket._outbound.budget_fields import BUDGETS
from nanobucket._outbound.fields import FIELDS, TRIGGERS, fields_of

# --------------------------------------------------------------------------
# The readings replaced, through the clients' private attributes (the references)


def private_host_key(request: httpx.Request) -> str:
    url = request.url
    parsed = url._uri_reference
    host, port = parsed.host, parsed.port
    if "xn--" in host and host.startswith("xn--"):
        host = url.host  # IDNA, decoded
    return host if port is None else f"{host}:{port}"


MARKS = ("ratelimit", "retry-after")  # a name without both is no limit field's, of any family
_TRIGGER_BYTES = frozenset(name.encode("ascii") for name in TRIGGERS)
_FIELD_BYTES = frozenset(name.encode("ascii") for name in FIELDS)
_TEXT = {name.encode("ascii"): name for name in FIELDS}


def private_httpx_fields(headers: Mapping[str, str]) -> dict[str, str] | None:
    raw = headers._list  # type: ignore[attr-defined]
    if _TRIGGER_BYTES.isdisjoint(map(itemgetter(1), raw)):
        return None
    found: dict[str, str] = {}
    for _, name, value in raw:
        if name in _FIELD_BYTES:
            key = _TEXT[name]
            if key in found:
                return fields_of(headers)
            try:
                found[key] = value.decode("ascii")
            except UnicodeDecodeError:
                return fields_of(headers)
    return found


def private_requests_fields(headers: Mapping[str, str]) -> dict[str, str] | None:
    store = headers._store  # type: ignore[attr-defined]
    if TRIGGERS.isdisjoint(store):
        return None
    return {name: value for name, (_, value) in store.items() if name in FIELDS}


# --------------------------------------------------------------------------
# The key of a request

LABEL = st.text(alphabet=string.ascii_letters + string.digits, min_size=1, max_size=8)
HOSTS = st.one_of(
    st.lists(LABEL, min_size=1, max_size=3).map(".".join),  # upper and lower case
    st.ip_addresses(v=4).map(str),
    st.ip_addresses(v=6).map(lambda address: f"[{address}]"),
    st.sampled_from(
        [
            "bücher.example",
            "BÜCHER.example",
            "中国.icom.museum",
            "xn--fiqs8s.icom.museum",
            "XN--FIQS8S.icom.museum",
            "www.xn--bcher-kva.example",
            "пример.рф",
            "localhost",
            "[::1]",
            "[::FFFF:192.168.0.1]",
        ]
    ),
)
SCHEMES = st.sampled_from(["http", "https", "HTTPS", "ws", "wss", "ftp", "gopher"])
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443, "ftp": 21}


@st.composite
def urls(draw: st.DrawFn) -> str:
    scheme = draw(SCHEMES)
    port = draw(
        st.one_of(
            st.just(""),
            st.just(f":{DEFAULT_PORTS.get(scheme.lower(), 70)}"),  # the scheme's default
            st.integers(0, 65535).map(lambda port: f":{port}"),
        )
    )
    user = draw(st.sampled_from(["", "user@", "user:secret@"]))
    path = draw(st.sampled_from(["", "/", "/items?page=2", "/a/b#frag"]))
    return f"{scheme}://{user}{draw(HOSTS)}{port}{path}"


@settings(max_examples=500, deadline=None)
@given(url=urls())
@example(url="https://API.example.com/x")
@example(url="http://127.0.0.1:8000/")
@example(url="https://[::1]:443/")
@example(url="https://xn--fiqs8s.icom.museum:8443/")
@example(url="http://www.xn--bcher-kva.example:80/")
def test_httpx_host_key_is_the_private_reading_for_every_url(url: str) -> None:
    try:
        request = httpx.Request("GET", url)
    except httpx.InvalidURL:
        assume(False)
        raise
    assert nb_httpx.host_key(request) == private_host_key(request)


@pytest.mark.parametrize(
    ("url", "key"),
    [
        ("https://API.Example.com/x", "api.example.com"),
        ("https://api.example.com:443/", "api.example.com"),
        ("https://api.example.com:8443/", "api.example.com:8443"),
        ("http://[::1]:8000/", "::1:8000"),
        ("http://[::1]/", "::1"),
        ("https://xn--fiqs8s.icom.museum/", "中国.icom.museum"),
        ("https://中国.icom.museum:8443/", "中国.icom.museum:8443"),
    ],
)
def test_httpx_host_key_of_each_kind_of_url(url: str, key: str) -> None:
    assert nb_httpx.host_key(httpx.Request("GET", url)) == key


# --------------------------------------------------------------------------
# The limit fields of an answer


def _cased(name: str) -> st.SearchStrategy[str]:
    flips = st.lists(st.booleans(), min_size=len(name), max_size=len(name))
    return flips.map(lambda up: "".join(c.upper() if u else c for c, u in zip(name, up)))


NAMES = st.sampled_from(
    [
        *sorted(FIELDS),
        "server",
        "content-type",
        "x-ratelimit-used",  # holds a mark, and is no field
        "ratelimitish",
        "x-retry-after-ms",
        "retry-after-ms",
        "x-ratelimit-limit-tokens",  # a budget's: no pacing field, yet marked
        "anthropic-ratelimit-requests-remaining",
    ]
).flatmap(_cased)
TEXT_VALUES = st.one_of(
    st.sampled_from(["1", "60", '"p";q=5;w=1', '"p";r=2;t=1', "a, b", "", "nö", "€"]),
    st.text(alphabet=string.printable.strip() + " éñ中", max_size=10),
)
VALUES = st.one_of(
    TEXT_VALUES.map(lambda text: text.encode("utf-8")),
    TEXT_VALUES.map(lambda text: text.encode("utf-8", "replace")).map(lambda b: b + b"\xff"),
    st.binary(max_size=6),
)


@settings(max_examples=600, deadline=None)
@given(headers=st.lists(st.tuples(NAMES, VALUES), max_size=8))
@example(headers=[("Server", b"x"), ("Date", b"now")])
@example(headers=[("RateLimit", b'"d";r=1;t=1'), ("ratelimit", b'"e";r=2;t=1')])
@example(headers=[("X-RateLimit-Used", b"3"), ("Date", b"now")])
@example(headers=[("Retry-After", b"\xe9")])
@example(headers=[("Retry-After", "né".encode()), ("Server", b"\xff")])
def test_httpx_limit_fields_are_the_private_reading_for_every_header_list(
    headers: list[tuple[str, bytes]],
) -> None:
    h = httpx.Headers([(name.encode("ascii"), value) for name, value in headers])
    assert nb_httpx.limit_fields(h) == private_httpx_fields(h)
    marked = any(mark in name.lower() for name, _ in headers for mark in MARKS)
    assert nb_httpx.read_fields(h) == (marked, private_httpx_fields(h))


@settings(max_examples=400, deadline=None)
@given(headers=st.lists(st.tuples(NAMES, TEXT_VALUES), max_size=8))
@example(headers=[("Server", "x"), ("Date", "now")])
@example(headers=[("Retry-After", "2"), ("retry-after", "3")])
@example(headers=[("X-RateLimit-Used", "3")])
def test_requests_limit_fields_are_the_private_reading_for_every_header_list(
    headers: list[tuple[str, str]],
) -> None:
    r: requests.structures.CaseInsensitiveDict[str] = requests.structures.CaseInsensitiveDict()
    for name, value in headers:  # a repeat replaces, its name's case the last one's
        r[name] = value
    assert nb_requests.limit_fields(r) == private_requests_fields(r)
    marked = any(mark in name.lower() for name in r for mark in MARKS)
    assert nb_requests.read_fields(r) == (marked, private_requests_fields(r))


def test_every_field_name_holds_a_mark_the_readings_look_for() -> None:
    assert tuple(mark.decode("ascii") for mark in nb_httpx._MARKS) == MARKS
    assert all(any(mark in name for mark in MARKS) for name in TRIGGERS)
    budgets = [f"x-ratelimit-{part}-{name}" for part in ("limit", "remaining", "reset")
               for name in ("requests", "tokens")]  # fmt: skip
    budgets += [f"anthropic-ratelimit-{name}-{part}" for name in BUDGETS
                for part in ("limit", "remaining", "reset")]  # fmt: skip
    assert all(any(mark in name for mark in MARKS) for name in [*budgets, "retry-after-ms"])


def test_a_plain_mapping_is_read_as_a_mapping() -> None:
    fields = {"Retry-After": "2", "Date": "now", "Server": "x"}
    expected = {"retry-after": "2", "date": "now"}
    assert nb_httpx.limit_fields(fields) == nb_requests.limit_fields(fields) == expected
    assert nb_httpx.limit_fields({"Server": "x"}) is nb_requests.limit_fields({}) is None


# --------------------------------------------------------------------------
# No private attribute of either client is named in the adapters


def _private_names(*objects: Any) -> set[str]:
    """The private attribute names (one underscore) of *objects* and their instances'."""
    names: set[str] = set()
    for thing in objects:
        for cls in type(thing).__mro__ if not isinstance(thing, type) else thing.__mro__:
            names.update(vars(cls))
        names.update(getattr(thing, "__dict__", {}))
        names.update(getattr(thing, "__slots__", ()))
    return {n for n in names if n.startswith("_") and not n.startswith("__")}


def _client_private_names() -> set[str]:
    response = httpx.Response(200, headers={"a": "b"}, request=httpx.Request("GET", "http://h/"))
    answer = requests.Response()
    answer.headers = requests.structures.CaseInsensitiveDict({"a": "b"})
    mock = httpx.MockTransport(lambda r: httpx.Response(200))
    with httpx.Client(transport=mock) as client, requests.Session() as session:
        return _private_names(
            httpx.URL("http://h/"),
            httpx.Headers({"a": "b"}),
            response,
            response.request,
            client,
            httpx.AsyncClient,
            httpx.HTTPTransport,
            httpx.AsyncHTTPTransport,
            mock,
            httpx.ByteStream(b""),
            answer,
            answer.headers,
            requests.Request("GET", "http://h/").prepare(),
            requests.adapters.HTTPAdapter(),
            session,
        )


def _attributes_named(source: str) -> set[str]:
    """Every attribute read or written in *source*, and every private-looking name its
    docstrings' examples use after a dot."""
    tree = ast.parse(source)
    names = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and ">>>" in node.value:
            for line in node.value.splitlines():
                text = line.strip()
                if text.startswith((">>>", "...")):
                    try:
                        names |= _attributes_named(text[4:])
                    except SyntaxError:
                        continue  # a continuation line: not a statement alone
    return names


def _adapter_sources() -> list[Path]:
    package = Path(nanobucket.__file__).parent
    return [package / "httpx.py", package / "requests.py", *sorted(package.glob("_outbound/*.py"))]


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


def _defined(paths: list[Path]) -> set[str]:
    """The names our own code defines: functions, methods, class attributes, ``self.x = ``."""
    names: set[str] = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                names.add(node.name)
            elif isinstance(node, (ast.Assign, ast.AnnAssign)):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                for target in targets:
                    if isinstance(target, ast.Name):
                        names.add(target.id)
                    elif isinstance(target, ast.Attribute) and _is_self(target.value):
                        names.add(target.attr)
    return names


@pytest.mark.parametrize("path", _adapter_sources(), ids=lambda path: path.name)
def test_no_private_attribute_of_httpx_or_requests_is_named(path: Path) -> None:
    # A name our own code defines too (``Pacer._state``, ``Outbound._timeout``) is ours.
    ours = _attributes_named(path.read_text(encoding="utf-8")) - _defined(_adapter_sources())
    reached = ours & _client_private_names()
    assert not reached, f"{path.name} reaches into the HTTP client's private {sorted(reached)}"
