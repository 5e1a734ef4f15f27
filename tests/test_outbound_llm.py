"""Both LLM header families end to end: a fake provider on loopback (tests/llm_provider.py)
that limits requests and tokens at once, called through httpx and requests, by one
process and by eight forked ones sharing their budgets (``shared=``)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import pytest
import requests

from nanobucket.httpx import RateLimitedTransport
from nanobucket.requests import RateLimitedAdapter
from nanobucket.shared import SharedKeyedTokenBucket

from conftest import NEEDS_SHARED_TABLE
from llm_provider import provider

REQUESTS, TOKENS, WINDOW = 60, 600, 2.0  # per window: the fake provider's budgets
PROMPT, MOST = 20, 40  # each call: 60 tokens charged, 50 used (a quarter of 40 unused)
SECONDS = 3.0  # each run sends for this long


def estimate(request: Any) -> dict[str, int]:
    asked = json.loads(request.content if isinstance(request, httpx.Request) else request.body)
    return {"tokens": asked["prompt_tokens"] + asked["max_tokens"]}


def settle_httpx(response: httpx.Response) -> dict[str, int]:
    return (
        {"tokens": json.loads(response.read())["usage"]["total_tokens"]}
        if (response.status_code == 200)
        else {}
    )


def settle_requests(response: requests.Response) -> dict[str, int]:
    return (
        {"tokens": response.json()["usage"]["total_tokens"]}
        if (response.status_code == 200)
        else {}
    )


def counts(url: str) -> dict[str, int]:
    return dict(httpx.get(f"{url}/counts").json())


def call_for(client: Any, url: str, seconds: float) -> list[int]:
    """Statuses of the calls *client* makes for *seconds*."""
    statuses = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        answer = client.post(
            f"{url}/v1/complete", json={"prompt_tokens": PROMPT, "max_tokens": MOST}
        )
        statuses.append(answer.status_code)
    return statuses


def most_tokens(seen: dict[str, int]) -> float:
    """The most tokens the provider admits in the span it admitted any: full, then its
    refill."""
    return TOKENS + TOKENS * (seen["span_ms"] / 1000) / WINDOW


@pytest.mark.parametrize("family", ["openai", "anthropic"])
def test_httpx_keeps_both_budgets_of_either_family(impl: ModuleType, family: str) -> None:
    with provider(REQUESTS, TOKENS, WINDOW, family) as url:
        transport = RateLimitedTransport(
            rate=1000, capacity=100, estimate=estimate, settle=settle_httpx
        )
        with httpx.Client(transport=transport) as client:
            statuses = call_for(client, url, SECONDS)
        seen = counts(url)
    assert statuses.count(429) == seen["refused"] == 0
    # At least the budget's refill over the run beside the first burst, at most all of it.
    assert TOKENS * SECONDS / WINDOW <= seen["tokens"] <= most_tokens(seen)


@pytest.mark.parametrize("family", ["openai", "anthropic"])
def test_requests_keeps_both_budgets_of_either_family(impl: ModuleType, family: str) -> None:
    with provider(REQUESTS, TOKENS, WINDOW, family) as url:
        session = requests.Session()
        session.mount("http://", RateLimitedAdapter(
            rate=1000, capacity=100, estimate=estimate, settle=settle_requests
        ))  # fmt: skip
        statuses = call_for(session, url, SECONDS)
        seen = counts(url)
    assert statuses.count(429) == seen["refused"] == 0
    assert TOKENS * SECONDS / WINDOW <= seen["tokens"] <= most_tokens(seen)


@pytest.mark.parametrize("family", ["both"])
@pytest.mark.usefixtures("impl")
@pytest.mark.c_extension
@NEEDS_SHARED_TABLE[1]
def test_eight_processes_share_the_budgets_as_one_client(tmp_path: Path, family: str) -> None:
    store = SharedKeyedTokenBucket.create(path=tmp_path / "llm", rate=1000, capacity=400)
    with provider(REQUESTS, TOKENS, WINDOW, family) as url:
        pids = []
        for i in range(8):
            pid = os.fork()
            if pid == 0:  # the child: one client, its statuses to a file, then out
                code = 1
                try:
                    transport = RateLimitedTransport(
                        rate=1000, capacity=100, estimate=estimate, settle=settle_httpx,
                        shared=store, timeout=None,
                    )  # fmt: skip
                    with httpx.Client(transport=transport) as client:
                        statuses = call_for(client, url, SECONDS)
                    (tmp_path / f"child{i}").write_text(json.dumps(statuses))
                    code = 0
                finally:
                    os._exit(code)
            pids.append(pid)
        codes = [os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) for pid in pids]
        seen = counts(url)
    assert codes == [0] * 8
    statuses = [s for i in range(8) for s in json.loads((tmp_path / f"child{i}").read_text())]
    assert statuses.count(429) == seen["refused"] <= 2
    assert 0.8 * TOKENS * SECONDS / WINDOW <= seen["tokens"] <= most_tokens(seen)
