"""Outbound goodput: a client set ten times too fast against a real limited API.

    python benchmarks/bench_outbound.py [--seconds 10 --runs 3 --workers 8]

A uvicorn on loopback enforces 50 req/s with bursts of 10 (nanobucket's
middleware, IETF fields; also only ``Retry-After``, and only
``X-RateLimit-*``), or 50 requests in any second (``sliding``: a sliding
window, announced as ``RateLimit-Policy: "p";q=50;w=1``). The client is
`nanobucket.httpx` configured at 500/s, bursts of 50, with 8 workers
(threads for sync and requests, tasks for async). Printed per kind:
admitted/s and as a share of the server's 50/s, the 429s after the first
one as a share of the answers after it, and the server's own count;
medians of the runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import uuid
from pathlib import Path

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "tests"))

from outbound_load import SERVER_RATE, api_server, drive, server_counts


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--fields", default="ietf,sliding,retry-after,x-ratelimit")
    parser.add_argument("--kinds", default="sync,async,requests")
    args = parser.parse_args()
    print(f"{args.runs} runs of {args.seconds:g} s, {args.workers} workers, client at 500/s")
    print(f"{'fields':12} {'kind':9} {'admitted/s':>10} {'of 50/s':>8} {'429 after 1st':>14}")
    with tempfile.TemporaryDirectory() as tmp:
        for fields in args.fields.split(","):
            with api_server(fields, Path(tmp) / f"{fields}.log") as url:
                for kind in args.kinds.split(","):
                    rates, shares, seen = [], [], []
                    for _ in range(args.runs):
                        run = drive(url, uuid.uuid4().hex, kind, args.workers, args.seconds)
                        assert not run.errors, run.errors
                        rates.append(run.admitted / run.seconds)
                        after = run.answered_after_first
                        shares.append(run.limited_after_first / after if after else 0.0)
                        seen.append(f"{run.admitted}/{run.limited}")
                    rate = statistics.median(rates)
                    print(
                        f"{fields:12} {kind:9} {rate:10.1f} {rate / SERVER_RATE:8.1%} "
                        f"{statistics.median(shares):14.2%}   (200/429 per run: {', '.join(seen)})"
                    )
                print(f"{'':12} server: {server_counts(url)}")


if __name__ == "__main__":
    main()
