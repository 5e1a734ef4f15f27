"""HTTP middleware overhead: in-process per request, and uvicorn requests/s.

    python benchmarks/bench_http.py inprocess [--n 200000]
    python benchmarks/bench_http.py uvicorn [--seconds 3 --connections 8 --rounds 7]
        [--before OLD/src/nanobucket]
    python benchmarks/bench_http.py fastapi [--n 50000]
    python benchmarks/bench_http.py hooks [--n 100000 --rounds 7] [--before OLD/src/nanobucket]

``inprocess`` awaits a bare ASGI app and the same app behind
`RateLimitMiddleware` (in-process `KeyedTokenBucket`, every request
admitted, IETF headers on) in one loop, median of 5 rounds, and prints the
difference per request. ``uvicorn`` starts a real uvicorn (1 process) on a
loopback port for each variant (bare; ``static``, the bare app answering
the IETF fields as constant bytes; the middleware with IETF headers and
with ``headers="off"``) and drives them in interleaved rounds with
keep-alive connections from this process; it prints requests/s and the
server's CPU time per request (``/proc/<pid>/stat``), medians of the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import subprocess
import sys
import time
from typing import Any

import nanobucket as nb
from nanobucket.asgi import RateLimitMiddleware

try:  # module level: FastAPI resolves the string annotations of its dependencies here
    from fastapi import Depends, FastAPI, Request, Response

    from nanobucket.fastapi import RateLimit
except ImportError:  # only the fastapi subcommand needs it
    pass

HERE = os.path.dirname(os.path.abspath(__file__))
BIG = 10**9  # capacity: every request is admitted, the common path


async def bare(scope: Any, receive: Any, send: Any) -> None:
    await send(
        {"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"2")]}
    )
    await send({"type": "http.response.body", "body": b"ok"})


def make_app(variant: str) -> Any:
    """The ASGI app for *variant*: bare, ietf, legacy, off or limited."""
    if variant == "bare":
        return bare
    if variant == "static":
        return _static(_ietf_fields())
    if variant == "off+static":  # the middleware adding nothing over an app sending the fields
        return RateLimitMiddleware(
            _static(_ietf_fields()), nb.KeyedTokenBucket(rate=BIG, capacity=BIG), headers="off"
        )
    if variant == "limited":  # every request answered 429
        limiter = nb.KeyedTokenBucket(rate=1e-6, capacity=1)
        limiter.allow("127.0.0.1")
        return RateLimitMiddleware(bare, limiter)
    limiter = nb.KeyedTokenBucket(rate=BIG, capacity=BIG)
    return RateLimitMiddleware(bare, limiter, headers=variant)


def _ietf_fields() -> list[tuple[bytes, bytes]]:
    """The fields the middleware adds with IETF headers, as it sends them for one request."""
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    coro = make_app("ietf")(dict(SCOPE), _noop_receive, send)
    # It never suspends (an in-process limiter), and uvicorn's loop may be running.
    with contextlib.suppress(StopIteration):
        coro.send(None)
    return [h for h in sent[0]["headers"] if h[0] != b"content-length"]


def _static(fields: list[tuple[bytes, bytes]]) -> Any:
    """The bare app answering *fields* as constant bytes: uvicorn's own cost for them."""
    headers = [(b"content-length", b"2"), *fields]

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"ok"})

    return app


async def _noop_send(message: Any) -> None:
    pass


async def _noop_receive() -> Any:
    return {"type": "http.request", "body": b"", "more_body": False}


async def _status(app: Any) -> int:
    """The status of one request to *app*."""
    sent: list[Any] = []

    async def send(message: Any) -> None:
        sent.append(message)

    await app(dict(SCOPE), _noop_receive, send)
    return int(sent[0]["status"])


SCOPE = {
    "type": "http",
    "method": "GET",
    "path": "/",
    "raw_path": b"/",
    "query_string": b"",
    "root_path": "",
    "scheme": "http",
    "server": ("127.0.0.1", 8000),
    "headers": [],
    "client": ("127.0.0.1", 5000),
}


async def _loop(app: Any, n: int) -> float:
    scope = dict(SCOPE)
    t0 = time.perf_counter_ns()
    for _ in range(n):
        await app(scope, _noop_receive, _noop_send)
    return (time.perf_counter_ns() - t0) / n


def _interleaved(apps: dict[str, Any], n: int, title: str, added: str, width: int) -> None:
    """Print ns per request of each app, the median of 5 interleaved rounds, and its
    difference to "bare"; interleaved, so a noisy neighbour hits every app alike."""
    times: dict[str, list[float]] = {v: [] for v in apps}
    for _ in range(5):
        for v, app in apps.items():
            times[v].append(asyncio.run(_loop(app, n)))
    median = {v: statistics.median(ts) for v, ts in times.items()}
    print(f"{title}implementation: {nb.IMPLEMENTATION}, {n} requests per round, median of 5")
    for v in apps:
        extra = "" if v == "bare" else f"   {added} {median[v] - median['bare']:7.0f} ns"
        print(f"  {v:{width}s} {median[v]:7.0f} ns/request{extra}")


def inprocess(n: int) -> None:
    variants = ["bare", "ietf", "legacy", "off", "limited"]
    apps = {v: make_app(v) for v in variants}
    _interleaved(apps, n, "", "overhead", 8)


def make_fastapi(variant: str) -> Any:
    """A FastAPI app with one route, for *variant*: bare, middleware, a dependency
    doing nothing, the RateLimit dependency, keyed (a key function taking a
    dependency), or that key's dependency alone."""
    limiter = nb.KeyedTokenBucket(rate=BIG, capacity=BIG)

    # async: a sync dependency runs in FastAPI's thread pool, which would time the pool
    async def client_host(request: Request) -> str:
        return request.client.host if request.client else ""

    async def by_client(host: str = Depends(client_host)) -> str:
        return host

    async def nothing(request: Request, response: Response) -> None:
        """A dependency taking what RateLimit takes and doing nothing: FastAPI's own cost."""

    dependencies = {
        "dependency": [Depends(RateLimit(limiter))],
        "keyed": [Depends(RateLimit(limiter, key=by_client))],
        "nothing": [Depends(nothing)],
        "its key alone": [Depends(by_client)],  # what FastAPI costs for the key's dependency
    }.get(variant, [])
    app = FastAPI(openapi_url=None)

    @app.get("/", dependencies=dependencies)
    async def root() -> str:
        return "ok"

    if variant == "middleware":
        app.add_middleware(RateLimitMiddleware, limiter=limiter)
    return app


def fastapi_inprocess(n: int) -> None:
    variants = ["bare", "middleware", "nothing", "dependency", "its key alone", "keyed"]
    apps = {v: make_fastapi(v) for v in variants}
    for v in variants:  # a variant answering 422 would time FastAPI's validation error
        status = asyncio.run(_status(apps[v]))
        if status != 200:
            raise SystemExit(f"{v}: the app answers {status}, not 200")
    _interleaved(apps, n, "FastAPI, ", "added", 13)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _drive(port: int, seconds: float, connections: int) -> int:
    request = b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"
    deadline = time.monotonic() + seconds
    done = 0

    async def one() -> None:
        nonlocal done
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        while time.monotonic() < deadline:
            writer.write(request)
            head = await reader.readuntil(b"\r\n\r\n")
            length = int(head.lower().split(b"content-length:")[1].split(b"\r\n")[0])
            await reader.readexactly(length)
            done += 1
        writer.close()

    await asyncio.gather(*(one() for _ in range(connections)))
    return done


def _cpu_ticks(pid: int) -> int:
    """User + system CPU time of process *pid*, in clock ticks (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)


def _start_server(variant: str, before: str | None = None) -> tuple[subprocess.Popen[bytes], int]:
    port = _free_port()
    env = dict(os.environ, BENCH_VARIANT=variant)
    if before is not None:  # another checkout's nanobucket package, imported first
        env["PYTHONPATH"] = os.path.dirname(os.path.abspath(before))
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "uvicorn",
            "bench_http:server_app",
            "--app-dir",
            HERE,
            "--port",
            str(port),
            "--log-level",
            "warning",
            "--no-access-log",
        ],
        env=env,
    )
    for _ in range(100):
        try:
            socket.create_connection(("127.0.0.1", port), 0.1).close()
            break
        except OSError:
            time.sleep(0.1)
    return proc, port


UVICORN_VARIANTS = ["bare", "static", "off", "off+static", "ietf"]


def uvicorn_rps(
    seconds: float,
    connections: int,
    rounds: int,
    before: str | None,
    only: list[str] | None = None,
) -> None:
    """One uvicorn per variant, driven in interleaved rounds: requests/s and the
    server's CPU per request (from ``/proc``), medians over the rounds.

    ``static`` is the bare app answering the IETF fields as constant bytes: the
    floor, what uvicorn itself costs for two more header fields; ``off+static``,
    the middleware with ``headers="off"`` in front of it, the floor of
    ``ietf`` (what is left is the cost of making the fields). With *before*
    (another checkout's ``src/nanobucket``), ``ietf, before`` runs its middleware.
    """
    variants = ["bare", *(v for v in only if v != "bare")] if only else list(UVICORN_VARIANTS)
    variants += ["ietf, before"] if before is not None else []
    servers = {v: _start_server(v.split(",")[0], before if "," in v else None) for v in variants}
    rps: dict[str, list[float]] = {v: [] for v in variants}
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    tick_us = 1e6 / os.sysconf("SC_CLK_TCK")
    try:
        for _proc, port in servers.values():
            asyncio.run(_drive(port, 0.5, connections))  # warm up
        for r in range(rounds):  # the order reversed every other round
            for v in variants[:: 1 if r % 2 else -1]:
                proc, port = servers[v]
                before = _cpu_ticks(proc.pid)
                n = asyncio.run(_drive(port, seconds, connections))
                rps[v].append(n / seconds)
                cpu[v].append((_cpu_ticks(proc.pid) - before) * tick_us / n)
    finally:
        for proc, _port in servers.values():
            proc.terminate()
            proc.wait(10)
    print(
        f"uvicorn, {connections} keep-alive connections, {seconds} s x {rounds} rounds "
        f"(medians; server CPU from /proc)"
    )
    for v in variants:
        # Added: the median over rounds of the difference to bare in the same
        # round (run back to back), so a drift of the machine's load cancels.
        added = statistics.median(c - b for c, b in zip(cpu[v], cpu["bare"], strict=True))
        extra = "" if v == "bare" else f"   added {added:5.2f} us"
        print(
            f"  {v:12s} {statistics.median(rps[v]):7.0f} requests/s "
            f"{statistics.median(cpu[v]):6.2f} us server CPU/request{extra}  "
            f"(per round: {' '.join(f'{x:.2f}' for x in cpu[v])})"
        )


def _load_before(src: str, module: str) -> Any:
    """*module* (``asgi`` or ``wsgi``) as another checkout has it, beside this one.

    Loaded inside this ``nanobucket`` package, so its relative imports take
    this checkout's ``_http``: only the middleware's own code differs.
    """
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        f"nanobucket._before_{module}", os.path.join(src, f"{module}.py")
    )
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _wsgi_loop(app: Any, n: int) -> float:
    environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/", "REMOTE_ADDR": "127.0.0.1"}

    def start_response(status: str, headers: Any, exc_info: Any = None) -> None:
        pass

    t0 = time.perf_counter_ns()
    for _ in range(n):
        body = app(environ, start_response)
        for _chunk in body:
            pass
        close = getattr(body, "close", None)
        if close is not None:
            close()
    return (time.perf_counter_ns() - t0) / n


def _wsgi_bare(environ: Any, start_response: Any) -> list[bytes]:
    start_response("200 OK", [("Content-Length", "2")])
    return [b"ok"]


def hooks_inprocess(n: int, before: str | None, rounds: int = 5) -> None:
    """The middlewares with no hook (this checkout, and *before*'s), a no-op hook,
    the Prometheus hook and a charge=: interleaved rounds, the median of each."""
    from prometheus_client import CollectorRegistry

    from nanobucket import wsgi
    from nanobucket.metrics import PrometheusMetrics

    limiter = nb.KeyedTokenBucket(rate=BIG, capacity=BIG)
    prom = PrometheusMetrics(registry=CollectorRegistry())
    asgi_apps: dict[str, Any] = {
        "bare": bare,
        "no hook": RateLimitMiddleware(bare, limiter),
        "no-op hook": RateLimitMiddleware(bare, limiter, on_decision=lambda e: None),
        "prometheus": RateLimitMiddleware(bare, limiter, on_decision=prom.hook),
        "charge=": RateLimitMiddleware(bare, limiter, charge=lambda scope, status: 1),
    }
    wsgi_apps: dict[str, Any] = {
        "bare": _wsgi_bare,
        "no hook": wsgi.RateLimitMiddleware(_wsgi_bare, limiter),
        "no-op hook": wsgi.RateLimitMiddleware(_wsgi_bare, limiter, on_decision=lambda e: None),
        "prometheus": wsgi.RateLimitMiddleware(_wsgi_bare, limiter, on_decision=prom.hook),
        "charge=": wsgi.RateLimitMiddleware(_wsgi_bare, limiter, charge=lambda env, status: 1),
    }
    if before is not None:
        old_asgi, old_wsgi = _load_before(before, "asgi"), _load_before(before, "wsgi")
        asgi_apps["no hook, before"] = old_asgi.RateLimitMiddleware(bare, limiter)
        wsgi_apps["no hook, before"] = old_wsgi.RateLimitMiddleware(_wsgi_bare, limiter)
    times: dict[str, list[float]] = {}
    for r in range(rounds):  # the order reversed every other round: no variant always first
        for v, app in list(asgi_apps.items())[:: 1 if r % 2 else -1]:
            times.setdefault("asgi " + v, []).append(asyncio.run(_loop(app, n)))
        for v, app in list(wsgi_apps.items())[:: 1 if r % 2 else -1]:
            times.setdefault("wsgi " + v, []).append(_wsgi_loop(app, n))
    print(f"implementation: {nb.IMPLEMENTATION}, {n} requests per round, {rounds} rounds")
    for v, ts in sorted(times.items(), key=lambda item: not item[0].endswith("bare")):
        median = statistics.median(ts)
        bare_ts = times[v[:5] + "bare"]
        extra = (
            ""
            if v.endswith("bare")
            else f"   added: median {median - statistics.median(bare_ts):6.0f} ns"
        )
        print(f"  {v:22s} median {median:6.0f} ns/request{extra}")


def __getattr__(name: str) -> Any:  # uvicorn's "bench_http:server_app"
    if name == "server_app":
        return make_app(os.environ.get("BENCH_VARIANT", "bare"))
    raise AttributeError(name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["inprocess", "uvicorn", "fastapi", "hooks"])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--connections", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--before", help="hooks, uvicorn: another checkout's src/nanobucket to compare"
    )
    parser.add_argument("--variants", help="uvicorn: a comma list of them (bare is always run)")
    args = parser.parse_args()
    if args.what == "inprocess":
        inprocess(args.n)
    elif args.what == "hooks":
        hooks_inprocess(args.n, args.before, args.rounds)
    elif args.what == "fastapi":
        fastapi_inprocess(args.n)
    else:
        only = args.variants.split(",") if args.variants else None
        uvicorn_rps(args.seconds, args.connections, args.rounds, args.before, only)


if __name__ == "__main__":
    main()
