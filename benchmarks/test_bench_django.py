"""Django: what the middleware and the decorator add to a request, through Django's WSGI handler.

    pytest benchmarks/test_bench_django.py --benchmark-only
    python benchmarks/test_bench_django.py [--rounds 21]   # the cases interleaved, ratios to bare

Each case calls a ``WSGIHandler`` (Django's own, as gunicorn calls it) with
one GET, ``calls_per_round`` times a round: ``bare`` (a view, no
middleware), ``middleware`` (the same view behind
``nanobucket.django.RateLimitMiddleware``), ``decorator`` (the view under
``@nanobucket.django.limit``) and ``wsgi_middleware`` (the bare handler
behind ``nanobucket.wsgi.RateLimitMiddleware``, for comparison). Every
request is admitted (an in-process `KeyedTokenBucket` that never runs dry)
and gets the IETF fields. The difference of medians is the added cost per
request; the ratio to ``bare`` is what a trivial view pays. Run as a
script, the cases take turns round by round (a machine whose load drifts
skews them alike) and it prints each median and its ratio to ``bare``.
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from collections.abc import Callable, Iterable
from typing import Any

import django
import pytest
from django.conf import settings

if not settings.configured:  # a benchmark run of its own: a minimal project, this module's URLs
    settings.configure(
        ROOT_URLCONF=__name__,
        ALLOWED_HOSTS=["*"],
        MIDDLEWARE=[],
        INSTALLED_APPS=[],
        LOGGING_CONFIG=None,
    )
    django.setup()

from django.core.handlers.wsgi import WSGIHandler
from django.http import HttpResponse
from django.test import override_settings
from django.urls import path

import nanobucket as nb
from nanobucket.django import limit
from nanobucket.wsgi import RateLimitMiddleware

BIG = 10**9  # rate and capacity: every request is admitted, the common path
CALLS = 2_000
ROUNDS = 15


def view(request: Any) -> HttpResponse:
    return HttpResponse(b"ok")


urlpatterns = [
    path("bare", view),
    path("limited", limit(nb.KeyedTokenBucket(rate=BIG, capacity=BIG))(view)),
]


def _environ(route: str) -> dict[str, Any]:
    return {
        "REQUEST_METHOD": "GET",
        "PATH_INFO": route,
        "SCRIPT_NAME": "",
        "SERVER_NAME": "testserver",
        "SERVER_PORT": "80",
        "REMOTE_ADDR": "127.0.0.1",
        "wsgi.url_scheme": "http",
        "wsgi.input": io.BytesIO(b""),
    }


def _start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
    pass


def _handler(case: str) -> Callable[[dict[str, Any], Any], Iterable[bytes]]:
    if case == "middleware":
        limits = {"limiter": nb.KeyedTokenBucket(rate=BIG, capacity=BIG)}
        mw = ["nanobucket.django.RateLimitMiddleware"]
        with override_settings(MIDDLEWARE=mw, NANOBUCKET=limits):
            return WSGIHandler()  # reads the settings now
    handler = WSGIHandler()
    if case == "wsgi_middleware":
        return RateLimitMiddleware(handler, nb.KeyedTokenBucket(rate=BIG, capacity=BIG))
    return handler


@pytest.mark.parametrize("case", ["bare", "middleware", "decorator", "wsgi_middleware"])
def test_django(case: str, benchmark: Any) -> None:
    handler = _handler(case)
    route = "/limited" if case == "decorator" else "/bare"
    seen: list[str] = []

    def one_round() -> None:
        for _ in range(CALLS):
            body = handler(_environ(route), _start_response)
            body.close()  # type: ignore[attr-defined]  # as a server does: request_finished

    def start_response(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> None:
        seen.append(status)
        if case != "bare":
            assert any(k.lower() == "ratelimit" for k, _ in headers)

    handler(_environ(route), start_response)
    assert seen == ["200 OK"]
    benchmark.group = "django: one GET through WSGIHandler"
    benchmark.extra_info.update(case=case, calls_per_round=CALLS)
    benchmark.pedantic(one_round, rounds=ROUNDS, iterations=1, warmup_rounds=1)


CASES = ["bare", "middleware", "decorator", "wsgi_middleware"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=21)
    args = parser.parse_args()
    handlers = {case: _handler(case) for case in CASES}
    times: dict[str, list[float]] = {case: [] for case in CASES}
    for _ in range(args.rounds):
        for case in CASES:
            handler, route = handlers[case], "/limited" if case == "decorator" else "/bare"
            t0 = time.process_time()  # CPU time: other processes on the machine do not count
            for _ in range(CALLS):
                handler(_environ(route), _start_response).close()  # type: ignore[attr-defined]
            times[case].append((time.process_time() - t0) / CALLS)
    bare = statistics.median(times["bare"])
    for case in CASES:
        median = statistics.median(times[case])
        print(
            f"{case:<16} {median * 1e6:8.2f} us/request  {median / bare:5.3f}x bare  "
            f"{(median - bare) * 1e6:+6.2f} us"
        )


if __name__ == "__main__":
    main()
