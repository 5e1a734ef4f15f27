"""Django: what the middleware and the decorator add to a request, through Django's WSGI handler.

    pytest benchmarks/test_bench_django.py --benchmark-only

Each case calls a ``WSGIHandler`` (Django's own, as gunicorn calls it) with
one GET, ``calls_per_round`` times a round: ``bare`` (a view, no
middleware), ``middleware`` (the same view behind
``nanobucket.django.RateLimitMiddleware``), ``decorator`` (the view under
``@nanobucket.django.limit``) and ``wsgi_middleware`` (the bare handler
behind ``nanobucket.wsgi.RateLimitMiddleware``, for comparison). Every
request is admitted (an in-process `KeyedTokenBucket` that never runs dry)
and gets the IETF fields. The difference of medians is the added cost per
request; the ratio to ``bare`` is what a trivial view pays.
"""

from __future__ import annotations

import io
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
