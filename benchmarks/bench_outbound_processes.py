"""Outbound goodput across processes: N clients, each too fast, against one limited API.

    python benchmarks/bench_outbound_processes.py [--seconds 10 --runs 3]
        [--processes 8 --threads 2 --fields ietf|sliding|x-ratelimit|openai|anthropic]
        [--slow-at 5]

A uvicorn on loopback enforces 100 req/s per ``X-API-Key`` (nanobucket's
middleware with IETF fields, bursts of 10; or ``--fields sliding``: at most
100 requests in any second; or ``--fields x-ratelimit``: the same bucket
announced by ``X-RateLimit-*`` alone, no rate and no ``Retry-After``).
``--fields openai`` or ``anthropic``: an LLM provider instead
(tests/llm_provider.py), 100 requests and 4000 tokens a second, announced in
that family's fields; each call asks for 60 tokens (20 of prompt, at most 40
of answer) and uses 50, so the tokens bind at 80 calls a second; the
transports estimate and settle each call's tokens.
``--processes`` forked worker processes each build their own
``httpx.Client`` over their own
`nanobucket.httpx.RateLimitedTransport`, configured at 500/s with bursts of
50 (the client's wrong limit), and call it from ``--threads`` threads each
for ``--seconds``, all with one API key (a fresh one per run). Rows:

* ``alone``: no ``shared=``; each process learns the server's limit and
  paces at it alone, so together they send N times too much.
* ``shared 100/s``: ``shared=`` a `SharedKeyedTokenBucket` at 100/s, bursts
  of 10 (the server's limit, known), made in the parent before the fork.
* ``shared 500/s``: ``shared=`` one at 500/s, bursts of 50 (only the
  client's wrong limit): the processes learn the server's from its fields
  and the shared table spreads it.

* ``shared 1000/s`` (LLM fields only, instead of the two above): one at
  1000/s, bursts of 400: fine and deep, as the budgets' shared prices want.

``--slow-at S``: the server halves its rate S seconds into each run (100/s
becomes 50/s, a fresh bucket per key); printed for each run, the 200s and the
429s in each second of it.

Printed per row: admitted/s (200s per second of the run) and as a share of
the server's 100/s (an LLM provider's 80 calls a second), 429s as a share of
all answers, the p99 latency of a call (pooled over the processes of a run),
medians of the runs; and the 200/429 counts of each run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import multiprocessing.synchronize
import os
import queue
import statistics
import sys
import tempfile
import threading
import time
import traceback
import uuid
from dataclasses import dataclass, field
from multiprocessing.sharedctypes import Synchronized
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "tests"))

import httpx

from nanobucket.httpx import RateLimitedTransport
from nanobucket.shared import SharedKeyedTokenBucket

from llm_provider import provider
from outbound_load import CLIENT_CAPACITY, CLIENT_RATE, api_server, server_counts

SERVER_RATE = 100  # what the API allows per key, per second
SERVER_BURST = 10  # its default burst (NB_OUT_BURST)
REFILL_PAUSE = 1.2  # seconds between runs: the server's bucket fills again
START_LEAD = 60.0  # the longest wait for every worker to be ready
JOIN_GRACE = 30.0  # past the run's end: the longest wait for a worker's report

#: row name -> (rate, capacity) of the shared table, or None for no ``shared=``
ROWS: dict[str, tuple[int, int] | None] = {
    "alone": None,
    "shared 100/s": (SERVER_RATE, SERVER_BURST),
    "shared 500/s": (CLIENT_RATE, CLIENT_CAPACITY),
    "shared 1000/s": (1000, 400),
}
LLM_FIELDS = ("openai", "anthropic")
LLM_REQUESTS, LLM_TOKENS = 100, 4000  # the provider's budgets per second
LLM_PROMPT, LLM_MOST = 20, 40  # each call asks for 60 tokens and uses 50 (a quarter unused)
LLM_CALLS = LLM_TOKENS // (LLM_PROMPT + LLM_MOST - LLM_MOST // 4)  # the binding rate: 80/s


def estimate(request: httpx.Request) -> dict[str, int]:
    """A call's tokens before it leaves: what it asks for."""
    asked = json.loads(request.content)
    return {"tokens": asked["prompt_tokens"] + asked["max_tokens"]}


def settle(response: httpx.Response) -> dict[str, int]:
    """A call's tokens after: what its answer says it used."""
    if response.status_code != 200:
        return {}
    return {"tokens": json.loads(response.read())["usage"]["total_tokens"]}


@dataclass
class Report:
    """What one worker process saw (sent back to the parent through a queue)."""

    index: int
    admitted: int = 0
    limited: int = 0
    other: int = 0  # any other status
    latencies: list[float] = field(default_factory=list)  # seconds per call
    last_answer: float = 0.0  # time.monotonic() of its last answer
    errors: list[str] = field(default_factory=list)
    admitted_at: list[float] = field(default_factory=list)  # seconds from the start
    limited_at: list[float] = field(default_factory=list)


@dataclass
class RunResult:
    admitted: int
    limited: int
    other: int
    seconds: float
    p99_ms: float
    errors: list[str]
    admitted_at: list[float] = field(default_factory=list)  # seconds from the start
    limited_at: list[float] = field(default_factory=list)

    @property
    def answers(self) -> int:
        return self.admitted + self.limited + self.other


def worker(
    index: int,
    url: str,
    api_key: str,
    threads: int,
    seconds: float,
    shared: SharedKeyedTokenBucket | None,
    ready: Any,
    go: multiprocessing.synchronize.Event,
    start: Synchronized[float],
    out: Any,
    llm: bool = False,
) -> None:
    """One process: its own client and transport, *threads* callers until the common stop
    (*llm*: of an LLM provider)."""
    report = Report(index)
    lock = threading.Lock()
    try:
        options: dict[str, Any] = {} if shared is None else {"shared": shared}
        if llm:
            options.update(estimate=estimate, settle=settle)
        transport = RateLimitedTransport(
            httpx.HTTPTransport(),
            rate=CLIENT_RATE,
            capacity=CLIENT_CAPACITY,
            timeout=None,
            **options,
        )
        client = httpx.Client(
            transport=transport,
            headers={"X-API-Key": api_key},
            timeout=30,
            limits=httpx.Limits(max_connections=threads),
        )
    except BaseException:
        report.errors.append(traceback.format_exc())
        ready.put(index)
        out.put(report)
        return
    ready.put(index)
    try:
        if not go.wait(START_LEAD):
            report.errors.append("no start signal")
            return
        stop = start.value + seconds

        def call_until_stop() -> None:
            try:
                while time.monotonic() < stop:
                    t = time.monotonic()
                    if llm:
                        asked = {"prompt_tokens": LLM_PROMPT, "max_tokens": LLM_MOST}
                        status = client.post(url + "/v1/complete", json=asked).status_code
                    else:
                        status = client.get(url + "/").status_code
                    now = time.monotonic()
                    with lock:
                        report.latencies.append(now - t)
                        report.last_answer = max(report.last_answer, now)
                        if status == 200:
                            report.admitted += 1
                            report.admitted_at.append(now - start.value)
                        elif status == 429:
                            report.limited += 1
                            report.limited_at.append(now - start.value)
                        else:
                            report.other += 1
            except BaseException:
                with lock:
                    report.errors.append(traceback.format_exc())

        pool = [threading.Thread(target=call_until_stop, daemon=True) for _ in range(threads)]
        for th in pool:
            th.start()
        for th in pool:
            th.join(max(0.0, stop - time.monotonic()) + JOIN_GRACE / 2)
        if any(th.is_alive() for th in pool):
            report.errors.append("a thread did not finish")
        client.close()
    except BaseException:
        report.errors.append(traceback.format_exc())
    finally:
        with lock:
            out.put(report)


def p99(values: list[float]) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def one_run(
    url: str,
    processes: int,
    threads: int,
    seconds: float,
    table: tuple[int, int] | None,
    llm: bool = False,
    slow_at: float | None = None,
) -> RunResult:
    """*processes* forked workers for *seconds*, with a fresh key (and a fresh shared table);
    *llm*: calling an LLM provider; *slow_at*: the server halves its rate that many
    seconds after the start."""
    ctx = multiprocessing.get_context("fork")
    api_key = uuid.uuid4().hex
    shared = (
        None
        if table is None
        else SharedKeyedTokenBucket.create_anonymous(rate=table[0], capacity=table[1])
    )
    ready: Any = ctx.Queue()
    out: Any = ctx.Queue()
    go = ctx.Event()
    start: Synchronized[float] = ctx.Value("d", 0.0)
    procs: list[multiprocessing.process.BaseProcess] = []
    reports: list[Report] = []
    errors: list[str] = []
    try:
        for i in range(processes):
            args = (i, url, api_key, threads, seconds, shared, ready, go, start, out, llm)
            proc = ctx.Process(target=worker, args=args, daemon=True)
            proc.start()
            procs.append(proc)
        deadline = time.monotonic() + START_LEAD
        for n in range(processes):
            try:
                ready.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                errors.append(f"only {n} of {processes} workers got ready")
                break
        if slow_at is not None:
            httpx.post(url + "/fast")
        start.value = time.monotonic()
        go.set()  # even after a failure: the ready workers run and report, not hang
        if slow_at is not None:
            time.sleep(max(0.0, start.value + slow_at - time.monotonic()))
            httpx.post(url + "/slow")
        deadline = start.value + seconds + JOIN_GRACE
        while len(reports) < processes:
            try:
                reports.append(out.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue.Empty:  # a worker is stuck or died
                errors.append(f"only {len(reports)} of {processes} workers reported")
                break
    finally:
        go.set()
        deadline = time.monotonic() + 10.0
        for done in procs:
            done.join(max(0.1, deadline - time.monotonic()))
        for straggler in procs:
            if straggler.is_alive():
                errors.append(f"worker {straggler.pid} killed")
                straggler.kill()
                straggler.join(5)
        for q in (ready, out):
            q.close()
            q.join_thread()
        if shared is not None:
            shared.close()
    for report in reports:
        errors += report.errors
    latencies = [lat for report in reports for lat in report.latencies]
    end = max((report.last_answer for report in reports), default=0.0)
    return RunResult(
        admitted=sum(r.admitted for r in reports),
        limited=sum(r.limited for r in reports),
        other=sum(r.other for r in reports),
        seconds=max(seconds, end - start.value),
        p99_ms=p99(latencies) * 1000,
        errors=errors,
        admitted_at=sorted(t for report in reports for t in report.admitted_at),
        limited_at=sorted(t for report in reports for t in report.limited_at),
    )


def per_second(times: list[float], seconds: float) -> list[int]:
    """How many of *times* (seconds from the start) fall in each whole second of the run."""
    counts = [0] * int(seconds)
    for t in times:
        if 0 <= t < len(counts):
            counts[int(t)] += 1
    return counts


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--processes", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    fields = ["ietf", "sliding", "x-ratelimit", *LLM_FIELDS]
    parser.add_argument("--fields", choices=fields, default="ietf")
    parser.add_argument("--rows", help="comma-separated, of: " + ", ".join(ROWS))
    parser.add_argument(
        "--slow-at",
        type=float,
        help="the server halves its rate this many seconds into each run (a token bucket's "
        "fields: ietf or x-ratelimit); printed: admitted and 429s per second",
    )
    args = parser.parse_args()
    if args.slow_at is not None and args.fields not in {"ietf", "x-ratelimit"}:
        parser.error("--slow-at needs --fields ietf or x-ratelimit")
    llm = args.fields in LLM_FIELDS
    shared_rows = ["shared 1000/s"] if llm else ["shared 100/s", "shared 500/s"]
    rows = args.rows.split(",") if args.rows else ["alone", *shared_rows]
    for row in rows:
        if row not in ROWS:
            parser.error(f"unknown row {row!r}")
    most = LLM_CALLS if llm else SERVER_RATE
    server = (
        f"an LLM provider ({args.fields} fields), {LLM_REQUESTS} requests and {LLM_TOKENS} "
        f"tokens/s: {LLM_CALLS} calls/s"
        if llm
        else f"{args.fields}, {SERVER_RATE}/s"
    )
    print(
        f"{args.runs} runs of {args.seconds:g} s, {args.processes} processes x {args.threads} "
        f"threads, each at {CLIENT_RATE}/s (bursts of {CLIENT_CAPACITY}); server: {server}"
    )
    share = f"of {most}/s"
    print(f"{'row':13} {'admitted/s':>10} {share:>9} {'429 share':>10} {'p99 ms':>9}")
    failed = False
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        if llm:
            url = stack.enter_context(provider(LLM_REQUESTS, LLM_TOKENS, 1.0, args.fields))
        else:
            log = Path(tmp) / f"{args.fields}.log"
            url = stack.enter_context(api_server(args.fields, log, rate=SERVER_RATE))
        for row in rows:
            rates, shares, p99s, seen = [], [], [], []
            for _ in range(args.runs):
                time.sleep(REFILL_PAUSE)
                run = one_run(
                    url, args.processes, args.threads, args.seconds, ROWS[row], llm, args.slow_at
                )
                if args.slow_at is not None:
                    print(
                        f"{row}: admitted per second {per_second(run.admitted_at, args.seconds)}"
                        f", 429s per second {per_second(run.limited_at, args.seconds)}"
                    )
                if run.errors:
                    failed = True
                    first = run.errors[0]
                    print(f"{row}: {len(run.errors)} errors; the first:\n{first}", file=sys.stderr)
                rates.append(run.admitted / run.seconds)
                shares.append(run.limited / run.answers if run.answers else 0.0)
                p99s.append(run.p99_ms)
                extra = f"+{run.other} other" if run.other else ""
                seen.append(f"{run.admitted}/{run.limited}{extra}")
            rate = statistics.median(rates)
            print(
                f"{row:13} {rate:10.1f} {rate / most:9.1%} "
                f"{statistics.median(shares):10.2%} {statistics.median(p99s):9.1f}"
                f"   (200/429 per run: {', '.join(seen)})",
                flush=True,
            )
        if llm:
            counted = httpx.get(url + "/counts", timeout=10).json()
            print(f"provider (tokens used, whole bench): {counted}")
        else:
            print(f"server: {server_counts(url)}")
    if failed:
        sys.exit(1)


if __name__ == "__main__":
    main()
