"""The exceptions a caller catches pickle as themselves.

A call refused in a process pool's worker reaches the caller through a
pickle: an exception that cannot be rebuilt from its pickle turns into the
pool's own error ("error unpickling") and loses its ``retry_after``.
"""

from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import pickle
from types import ModuleType

import aiohttp
import httpx
import pytest
import requests

import nanobucket as nb
from nanobucket import aiohttp as nb_aiohttp
from nanobucket import fastapi as nb_fastapi
from nanobucket import httpx as nb_httpx
from nanobucket import requests as nb_requests
from nanobucket._outbound.adapter import LimitTimeout


def test_rate_limited_keeps_its_wait_and_decision(impl: ModuleType) -> None:
    bucket = impl.TokenBucket(rate=1, capacity=1, clock=lambda: 0)
    bucket.allow()
    err = nb.RateLimited(bucket.check().retry_after_ns, bucket.check())
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is nb.RateLimited
    assert (back.retry_after_ns, back.decision, str(back)) == (
        1_000_000_000,
        err.decision,
        "rate limited: retry after 1.000 s",
    )


@pytest.mark.parametrize(
    ("cls", "base"),
    [
        (nb_httpx.RateLimitTimeout, httpx.TimeoutException),
        (nb_requests.RateLimitTimeout, requests.exceptions.Timeout),
        (nb_aiohttp.RateLimitTimeout, aiohttp.ServerTimeoutError),
    ],
)
def test_an_outbound_timeout_keeps_its_key_and_wait(cls: type[LimitTimeout], base: type) -> None:
    err = cls("wait 1.5 s", key="api.example.com", retry_after_ns=1_500_000_000)
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and isinstance(back, base)
    assert (str(back), back.key, back.retry_after_ns, back.retry_after) == (
        "wait 1.5 s",
        "api.example.com",
        1_500_000_000,
        1.5,
    )


def test_the_fastapi_429_keeps_its_status_fields_and_body() -> None:
    decision = nb.TokenBucket(rate=1, capacity=1, clock=lambda: 0).check()
    headers = [(b"retry-after", b"1"), (b"content-type", b"application/problem+json")]
    err = nb_fastapi.RateLimited(decision, headers, b'{"status":429}')
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is nb_fastapi.RateLimited
    assert (back.status_code, back.headers, back.decision, back.body) == (
        429,
        {"retry-after": "1"},
        decision,
        b'{"status":429}',
    )


def _refused() -> None:
    ping = nb.limit(nb.TokenBucket(rate=1, capacity=1, clock=lambda: 0))(int)
    ping()
    ping()


def test_a_call_refused_in_a_process_pool_reaches_the_caller_as_rate_limited() -> None:
    context = multiprocessing.get_context("spawn")
    with cf.ProcessPoolExecutor(1, mp_context=context) as pool:
        future = pool.submit(_refused)
        with pytest.raises(nb.RateLimited) as caught:
            future.result(timeout=60)
    assert caught.value.retry_after_ns == 1_000_000_000
    assert caught.value.decision.allowed is False
