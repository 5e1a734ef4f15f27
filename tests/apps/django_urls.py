"""URLs and views of the Django tests: plain, decorated, class-based and DRF views."""

from __future__ import annotations

from typing import Any

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
class Limited(View):
    def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("class")


class LimitedAsync(View):
    @method_decorator(limit(DECORATED["acbv"]))
    async def get(self, request: HttpRequest) -> HttpResponse:
        return HttpResponse("async class")


# The throttled API views: the tests set `limiter` (and DRF's rate) per test.
class Throttle(NanobucketThrottle):  # type: ignore[misc,valid-type]
    limiter = nb.KeyedTokenBucket(rate=1 / 3600, capacity=10)


class DRFThrottle(SimpleRateThrottle):  # type: ignore[misc]
    scope = "drf"

    def get_cache_key(self, request: Any, view: Any) -> str:
        return "drf-" + self.get_ident(request)


class Api(APIView):  # type: ignore[misc]
    throttle_classes = [Throttle]

    def get(self, request: Any) -> Any:
        return Response({"ok": True})


class DRFApi(APIView):  # type: ignore[misc]
    throttle_classes = [DRFThrottle]

    def get(self, request: Any) -> Any:
        return Response({"ok": True})


urlpatterns = [
    path("bare", bare),
    path("hello", hello),
    path("hello-async", hello_async),
    path("status/<int:code>", status),
    path("boom", boom),
    path("limited", limited),
    path("limited-async", limited_async),
    path("class", Limited.as_view()),
    path("class-async", LimitedAsync.as_view()),
    path("api", Api.as_view()),
    path("drf", DRFApi.as_view()),
]
