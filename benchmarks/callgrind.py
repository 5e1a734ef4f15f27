"""Instructions per call under callgrind: repeatable where wall-clock time is not.

    python benchmarks/callgrind.py              # every case, a table
    python benchmarks/callgrind.py --json out.json c_allow c_keyed
    python benchmarks/callgrind.py asgi_ietf wsgi_ietf     # the middlewares, per request
    python benchmarks/callgrind.py asgi_all_of wsgi_all_of # the same over all_of
    python benchmarks/callgrind.py asgi_tiered wsgi_tiered # ... and over tiered
    python benchmarks/callgrind.py c_keyed_check all_of_check  # check, a table and all_of

Each case runs twice under ``valgrind --tool=callgrind``, once with N calls
and once with 2N; the same program otherwise (imports, table set-up, 100k
keys filled), so start-up cancels (with ``PYTHONHASHSEED=0``: the same start-up both
times) and ``(I(2N) - I(N)) / N`` is the
instruction count of one call *including* the loop around it. The floor (a
no-op Cython method called the same way) is reported beside it, and so is
the difference: what the limiter itself costs. The ``asgi_*`` and ``wsgi_*``
cases are one request through the middleware (an in-process keyed bucket that
admits every request; the ``*_all_of`` cases: that bucket and one per instance,
under ``all_of``; the ``*_tiered`` ones: that bucket as one of two plans)
against the bare app called the same way: what the middleware adds. An ASGI
request is driven by ``coro.send(None)`` (the in-process limiter never
suspends), so no event loop is counted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile

N = 100_000  # calls in the short run; the long run makes 2N
KEYS = 100_000

SINGLE = """
import sys
from nanobucket._core import _bucket_c, _bucket_py
from nanobucket.bench._floor import Floor
from nanobucket.reference import MonotonicNaiveBucket
n = int(sys.argv[1])
f = {make}
r = range(n)
for _ in r:
    f()
"""

KEYED = """
import functools
import sys
from nanobucket._core import _bucket_c, _bucket_py
import nanobucket as nb
from nanobucket.shared import SharedKeyedTokenBucket
from nanobucket.bench._floor import Floor
passes = int(sys.argv[1]) // {keys}
keys = [f"user:{{i:07d}}" for i in range({keys})]
f = {make}
for k in keys:  # every key present before counting: steady state
    f(k)
for _ in range(passes):
    for k in keys:
        f(k)
"""

ASGI = """
import sys
import nanobucket as nb
from nanobucket.asgi import RateLimitMiddleware, Route, header
n = int(sys.argv[1])
START = {{"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}}
BODY = {{"type": "http.response.body", "body": b"ok"}}
async def bare(scope, receive, send):
    await send(dict(START))  # a fresh message: the middleware sets its headers
    await send(BODY)
async def send(message):
    pass
limiter = nb.KeyedTokenBucket(rate=10**9, capacity=10**9)
app = {make}
scope = {{"type": "http", "method": "GET", "path": "/api/items", "query_string": b"",
         "headers": [(b"host", b"localhost"), (b"x-api-key", b"k1")],
         "client": ("127.0.0.1", 5000)}}
for _ in range(n):
    try:
        app(dict(scope), None, send).send(None)
    except StopIteration:
        pass
"""

WSGI = """
import sys
import nanobucket as nb
from nanobucket.wsgi import RateLimitMiddleware, Route, header
n = int(sys.argv[1])
def bare(environ, start_response):
    start_response("200 OK", [("Content-Length", "2")])
    return [b"ok"]
def start_response(status, headers, exc_info=None):
    pass
limiter = nb.KeyedTokenBucket(rate=10**9, capacity=10**9)
app = {make}
environ = {{"REQUEST_METHOD": "GET", "SCRIPT_NAME": "", "PATH_INFO": "/api/items",
           "HTTP_HOST": "localhost", "HTTP_X_API_KEY": "k1", "REMOTE_ADDR": "127.0.0.1"}}
for _ in range(n):
    app(dict(environ), start_response)
"""

# The case study's per-client and per-instance limits, both admitting every request.
ALL_OF = "nb.all_of(limiter, nb.TokenBucket(rate=10**9, capacity=10**9))"
# Two plans, the key's plan picked per request (every key on "free" here).
TIERED = (
    'nb.tiered({"free": limiter, "pro": nb.KeyedTokenBucket(rate=10**9, capacity=10**9)}, '
    'tier=lambda key: "free")'
)
ROUTES = '[Route("/healthz", exempt=True), Route("/api/*", cost=2), Route("/login")]'

# name -> (template, expression for f, what it is)
CASES: dict[str, tuple[str, str, str]] = {
    "floor_allow": (SINGLE, "Floor().allow", "floor: no-op Floor.allow()"),
    "floor_clock": (SINGLE, "Floor().allow_clock", "Floor.allow_clock(): the call + a clock read"),
    "c_allow": (SINGLE, "_bucket_c.TokenBucket(10**9, 10**6).allow", "TokenBucket.allow() (c)"),
    "py_allow": (SINGLE, "_bucket_py.TokenBucket(10**9, 10**6).allow", "TokenBucket.allow() (py)"),
    "naive_allow": (SINGLE, "MonotonicNaiveBucket(10**9, 10**6).allow", "naive allow()"),
    "floor_keyed": (KEYED, "Floor().allow_key", "floor: no-op Floor.allow_key(k)"),
    "dict_get": (KEYED, "dict.fromkeys(keys, 0).get", "dict.get(k), 100k str keys"),
    "c_keyed": (
        KEYED,
        "_bucket_c.KeyedTokenBucket(0.01, 10_000).allow",
        "KeyedTokenBucket.allow(k) (c), 100k str keys",
    ),
    "c_keyed_check": (
        KEYED,
        "_bucket_c.KeyedTokenBucket(0.01, 10_000).check",
        "KeyedTokenBucket.check(k) (c), 100k str keys",
    ),
    "all_of_check": (
        KEYED,
        "nb.all_of(_bucket_c.KeyedTokenBucket(0.01, 10_000), "
        "_bucket_c.TokenBucket(10**9, 10**9)).check",
        "all_of(keyed, bucket).check(k) (c), 100k keys",
    ),
    "c_keyed_acquire": (
        KEYED,
        "_bucket_c.KeyedTokenBucket(0.01, 10_000).acquire",
        "KeyedTokenBucket.acquire(k) (c), 100k str keys",
    ),
    "c_keyed_reserve": (
        KEYED,
        "functools.partial(_bucket_c.KeyedTokenBucket(0.01, 10_000).reserve, max_wait_ns=0)",
        "KeyedTokenBucket.reserve(k) (c): an int",
    ),
    "c_keyed_reservation": (
        KEYED,
        "functools.partial(_bucket_c.KeyedTokenBucket(0.01, 10_000).reservation, max_wait_ns=0)",
        "KeyedTokenBucket.reservation(k) (c): a Reservation",
    ),
    "py_keyed": (
        KEYED,
        "_bucket_py.KeyedTokenBucket(0.01, 10_000).allow",
        "KeyedTokenBucket.allow(k) (py), 100k str keys",
    ),
    "shared_keyed": (
        KEYED,
        "SharedKeyedTokenBucket.create_anonymous(rate=0.01, capacity=10_000).allow",
        "SharedKeyedTokenBucket.allow(k), 100k str keys",
    ),
    "asgi_bare": (ASGI, "bare", "floor: the bare ASGI app"),
    "asgi_ietf": (ASGI, "RateLimitMiddleware(bare, limiter)", "ASGI middleware, IETF fields"),
    "asgi_off": (
        ASGI,
        "RateLimitMiddleware(bare, limiter, headers='off')",
        "ASGI middleware, headers='off'",
    ),
    "asgi_routes": (
        ASGI,
        f"RateLimitMiddleware(bare, limiter, routes={ROUTES})",
        "ASGI middleware, IETF fields, 3 routes",
    ),
    "asgi_api_key": (
        ASGI,
        f"RateLimitMiddleware(bare, limiter, key=header('X-API-Key'), routes={ROUTES})",
        "ASGI middleware, IETF fields, 3 routes, keyed by X-API-Key",
    ),
    "asgi_all_of": (
        ASGI,
        f"RateLimitMiddleware(bare, {ALL_OF})",
        "ASGI middleware, IETF fields, all_of(2 layers)",
    ),
    "asgi_tiered": (
        ASGI,
        f"RateLimitMiddleware(bare, {TIERED})",
        "ASGI middleware, IETF fields, tiered(2 plans)",
    ),
    "wsgi_bare": (WSGI, "bare", "floor: the bare WSGI app"),
    "wsgi_ietf": (WSGI, "RateLimitMiddleware(bare, limiter)", "WSGI middleware, IETF fields"),
    "wsgi_off": (
        WSGI,
        "RateLimitMiddleware(bare, limiter, headers='off')",
        "WSGI middleware, headers='off'",
    ),
    "wsgi_routes": (
        WSGI,
        f"RateLimitMiddleware(bare, limiter, routes={ROUTES})",
        "WSGI middleware, IETF fields, 3 routes",
    ),
    "wsgi_api_key": (
        WSGI,
        f"RateLimitMiddleware(bare, limiter, key=header('X-API-Key'), routes={ROUTES})",
        "WSGI middleware, IETF fields, 3 routes, keyed by X-API-Key",
    ),
    "wsgi_all_of": (
        WSGI,
        f"RateLimitMiddleware(bare, {ALL_OF})",
        "WSGI middleware, IETF fields, all_of(2 layers)",
    ),
    "wsgi_tiered": (
        WSGI,
        f"RateLimitMiddleware(bare, {TIERED})",
        "WSGI middleware, IETF fields, tiered(2 plans)",
    ),
}
FLOOR_OF = {
    "floor_clock": "floor_allow",
    "c_allow": "floor_allow",
    "py_allow": "floor_allow",
    "naive_allow": "floor_allow",
    "dict_get": "floor_keyed",
    "c_keyed": "floor_keyed",
    "c_keyed_check": "floor_keyed",
    "c_keyed_acquire": "floor_keyed",
    "c_keyed_reserve": "floor_keyed",
    "c_keyed_reservation": "floor_keyed",
    "all_of_check": "floor_keyed",
    "py_keyed": "floor_keyed",
    "shared_keyed": "floor_keyed",
    "asgi_ietf": "asgi_bare",
    "asgi_off": "asgi_bare",
    "asgi_routes": "asgi_bare",
    "asgi_api_key": "asgi_bare",
    "wsgi_ietf": "wsgi_bare",
    "wsgi_off": "wsgi_bare",
    "wsgi_routes": "wsgi_bare",
    "wsgi_api_key": "wsgi_bare",
    "asgi_all_of": "asgi_bare",
    "wsgi_all_of": "wsgi_bare",
    "asgi_tiered": "asgi_bare",
    "wsgi_tiered": "wsgi_bare",
}


def instructions(code: str, calls: int) -> int:
    """Total instructions callgrind counts for ``python -c code calls``."""
    with tempfile.NamedTemporaryFile(suffix=".out") as out:
        proc = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                f"--callgrind-out-file={out.name}",
                sys.executable,
                "-c",
                code,
                str(calls),
            ],
            # A fixed hash seed makes start-up (imports, dict probing) the same
            # instructions in both runs; a random one moves it by millions.
            env={**os.environ, "PYTHONHASHSEED": "0"},
            capture_output=True,
            text=True,
            check=False,
        )
    if proc.returncode != 0:
        raise SystemExit(f"callgrind failed: {proc.stderr.strip().splitlines()[-1:]}")
    match = re.search(r"Collected : (\d+)", proc.stderr)
    if match is None:
        raise SystemExit("callgrind printed no instruction count")
    return int(match.group(1))


def per_call(name: str) -> float:
    template, make, _ = CASES[name]
    code = template.format(make=make, keys=KEYS)
    return (instructions(code, 2 * N) - instructions(code, N)) / N


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("cases", nargs="*", help=f"any of {', '.join(CASES)} (default: all)")
    p.add_argument("--json", metavar="FILE")
    args = p.parse_args(argv)
    unknown = [n for n in args.cases if n not in CASES]
    if unknown:
        p.error(f"unknown case {unknown[0]!r}")
    if shutil.which("valgrind") is None:
        p.exit(2, "callgrind.py: error: valgrind is not installed\n")
    names = args.cases or list(CASES)
    names = sorted(
        set(names) | {FLOOR_OF[n] for n in names if n in FLOOR_OF}, key=list(CASES).index
    )
    counts = {name: per_call(name) for name in names}
    print(
        f"instructions per call (loop included), (I(2N) - I(N)) / N with N = {N:,}; "
        f"Python {sys.version.split()[0]}"
    )
    for name in names:
        floor = FLOOR_OF.get(name)
        extra = f"   {counts[name] - counts[floor]:8.0f} over the floor" if floor else ""
        print(f"  {CASES[name][2]:<48} {counts[name]:8.0f}{extra}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"n": N, "instructions_per_call": counts}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
