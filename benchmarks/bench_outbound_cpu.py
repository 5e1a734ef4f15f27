"""Outbound CPU: what the pacing adds to each request, over httpx's MockTransport.

    PYTHONPATH=src python benchmarks/bench_outbound_cpu.py [--n 20000 --runs 5]

Per run, the same GETs through a plain client and through
`RateLimitedTransport` / `AsyncRateLimitedTransport` at a limit never
reached (so no wait): the difference is the key, the ticket, the send loop
and the reading of the answer's fields. Printed: µs added per request, the
median of the runs, then each run. Compare two trees by running it with
each on PYTHONPATH, alternately.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

import httpx

from nanobucket.httpx import AsyncRateLimitedTransport, RateLimitedTransport

UNREACHED = {"rate": 10**9, "capacity": 10**9}


def _ok(request: httpx.Request) -> httpx.Response:
    return httpx.Response(200)


def _sync_us(n: int) -> float:
    plain = httpx.Client(transport=httpx.MockTransport(_ok))
    paced = httpx.Client(transport=RateLimitedTransport(httpx.MockTransport(_ok), **UNREACHED))
    times = []
    for client in (plain, paced):
        start = time.perf_counter()
        for _ in range(n):
            client.get("http://h/")
        times.append(time.perf_counter() - start)
    return (times[1] - times[0]) / n * 1e6


async def _async_us(n: int) -> float:
    plain = httpx.AsyncClient(transport=httpx.MockTransport(_ok))
    transport = AsyncRateLimitedTransport(httpx.MockTransport(_ok), **UNREACHED)
    paced = httpx.AsyncClient(transport=transport)
    times = []
    for client in (plain, paced):
        start = time.perf_counter()
        for _ in range(n):
            await client.get("http://h/")
        times.append(time.perf_counter() - start)
    return (times[1] - times[0]) / n * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=20000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    runs: dict[str, list[float]] = {"sync": [], "async": []}
    for _ in range(args.runs):
        runs["sync"].append(_sync_us(args.n))
        runs["async"].append(asyncio.run(_async_us(args.n)))
    for kind, added in runs.items():
        each = " ".join(f"{x:.2f}" for x in added)
        print(f"{kind:5} +{statistics.median(added):.2f} µs/request  ({each})")


if __name__ == "__main__":
    main()
