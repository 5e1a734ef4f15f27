"""URLs and views of the Django tests: plain, decorated, class-based and DRF views."""

from __future__ import annotations

from typing import Any, ClassVar

from django.http import HttpRequest, HttpResponse
from django.urls import path
from django.utils.decorators import method_decorator
from django.views import View
from rest_framework.response import Response
from rest_framework.throttling import SimpleRateThrottle
from rest_framework.views import APIView

import nanobucket as nb
from nanobucket.django import NanobucketThrottle, limit


def bare(request: HttpRequest) -> HttpResponse:
    return HttpResponse("bare")


def hello(request: HttpRequest) -> HttpResponse:
    return HttpResponse("hello")


async def hello_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("hello async")


def files(request: HttpRequest, p: str) -> HttpResponse:
    return HttpResponse("files:" + p)


def status(request: HttpRequest, code: int) -> HttpResponse:
    return HttpResponse("status", status=code)


def boom(request: HttpRequest) -> HttpResponse:
    raise RuntimeError("boom")


# The decorated views' limiters: tests reach them here (`DECORATED`).
DECORATED = {
    "sync": nb.KeyedTokenBucket(rate=1 / 3600, capacity=2),
    "async": nb.KeyedTokenBucket(rate=1 / 3600, capacity=2),
    "cbv": nb.KeyedTokenBucket(rate=1 / 3600, capacity=2),
    "acbv": nb.KeyedTokenBucket(rate=1 / 3600, capacity=2),
}


@limit(DECORATED["sync"], key="user")
def limited(request: HttpRequest) -> HttpResponse:
    return HttpResponse("limited")


@limit(DECORATED["async"], key="user")
async def limited_async(request: HttpRequest) -> HttpResponse:
    return HttpResponse("limited async")


@method_decorator(limit(DECORATED["cbv"]), name="dispatch")
class Limited(View):  # type: ignore[misc]
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("class")


class LimitedAsync(View):  # type: ignore[misc]
    @method_decorator(limit(DECORATED["acbv"]))  # type: ignore[untyped-decorator]
    async def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("async class")


# The middleware's limiter named by a dotted path in one test.
SHARED = nb.KeyedTokenBucket(rate=1 / 3600, capacity=5)


# The throttled API views (the tests pass their own throttle classes to as_view).
class Throttle(NanobucketThrottle):
    limiter = nb.KeyedTokenBucket(rate=1 / 3600, capacity=10)


class DRFThrottle(SimpleRateThrottle):  # type: ignore[misc]
    scope = "drf"

    def get_cache_key(self, request: Any, view: Any) -> str:
        return "drf-" + str(self.get_ident(request))


class Api(APIView):  # type: ignore[misc]
    throttle_classes: ClassVar[list[type]] = [Throttle]

    def get(self, request: Any) -> Any:
        return Response({"ok": True})


class DRFApi(APIView):  # type: ignore[misc]
    throttle_classes: ClassVar[list[type]] = [DRFThrottle]

    def get(self, request: Any) -> Any:
        return Response({"ok": True})


urlpatterns = [
    path("bare", bare),
    path("hello", hello),
    path("hello-async", hello_async),
    path("status/<int:code>", status),
    path("boom", boom),
    path("files/<path:p>", files),
    path("limited", limited),
    path("limited-async", limited_async),
    path("class", Limited.as_view()),
    path("class-async", LimitedAsync.as_view()),
    path("api", Api.as_view()),
    path("drf", DRFApi.as_view()),
]
