"""Redis CPU per decision of the limiter's Lua scripts: a script, not part of the pytest suite.

    python benchmarks/bench_redis_cpu.py            # starts its own redis-server on a free port
    python benchmarks/bench_redis_cpu.py --url redis://127.0.0.1:6379/0 --n 20000

Redis's one core is shared by every instance, so what a decision costs there
is the limit's ceiling. For each case it resets the server's statistics
(``CONFIG RESETSTAT``), runs the decisions through the limiter, and reads
``usec_per_call`` of ``cmdstat_evalsha`` from ``INFO commandstats``. Beside
each it runs the floor: a script that does nothing, given the same keys and
arguments and returning a reply of the same shape (what EVALSHA itself costs;
and the floor of the single script's earlier form, six arguments and four
integers back),
and the bare Redis calls a decision cannot avoid (TIME, GET, SET ... PX) with
nothing computed. It prints us per decision (batches: per key) and the
client-side decisions/s of the same run.

With ``--callgrind`` it counts instructions instead (repeatable where
wall-clock time is not): redis-server runs under ``valgrind --tool=callgrind``
once with N script calls and once with 2N, and ``(I(2N) - I(N)) / N`` is one
call (per key for batches), start-up cancelled.

With ``--client`` it measures the other side: the CPU time of the *client*
process per sync decision (``time.process_time``, median and range of
``--runs`` runs of N calls each, the cases interleaved), against two
baselines of the same run: the floor, a bare socket sending the same
``EVALSHA`` (pre-encoded) and reading its reply, and redis-py's own
``evalsha`` on a client like the limiter's. ``--client --callgrind`` counts
the client's instructions per call instead (the Python process under
callgrind with N and 2N calls)::

    python benchmarks/bench_redis_cpu.py --client --n 20000 --runs 7
    python benchmarks/bench_redis_cpu.py --client --callgrind --n 2000
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import redis
from bench_redis import on_server, redis_server_binary

from nanobucket import redis as nbr
from nanobucket.redis import _limits

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, "tests"))

#: Same keys, arguments and reply (one integer) as lua/gcra.lua, no work.
FLOOR_ONE = "return 0"
#: What the floor was for the script's earlier form: six arguments, a reply of four integers.
FLOOR_ONE_OLD = "return {1, 0, 0, 0}"
OLD_ARGS = (b"1", b"1000000", 1, b"", b"1", b"0")
#: Same keys, arguments and reply as lua/gcra_many.lua, no work.
FLOOR_MANY = "return string.rep('\\1', #KEYS)"
#: The Redis calls one consuming decision makes, at constant values.
CALLS_ONE = (
    "local t = redis.call('TIME') "
    "local v = redis.pcall('GET', KEYS[1]) "
    "redis.call('SET', KEYS[1], '1700000000000000', 'PX', '1001') "
    "return 0"
)
CALLS_MANY = (
    "local t = redis.call('TIME') "
    "for i = 1, #KEYS do "
    "local v = redis.pcall('GET', KEYS[i]) "
    "redis.call('SET', KEYS[i], '1700000000000000', 'PX', '1001') "
    "end "
    "return string.rep('\\1', #KEYS)"
)


def script_usec(client: Any, run: Callable[[], None], n: int) -> tuple[float, float, int]:
    """Run *run* *n* times; return (usec_per_call of evalsha, client calls/s, calls counted)."""
    run()  # script loaded, connection open
    client.config_resetstat()
    start = time.perf_counter()
    for _ in range(n):
        run()
    per_s = n / (time.perf_counter() - start)
    stats = client.info("commandstats").get("cmdstat_evalsha", {})
    return float(stats.get("usec_per_call", 0.0)), per_s, int(stats.get("calls", 0))


def report(label: str, usec: float, per_s: float, per: int, floor: float) -> None:
    us, fl = usec / per, floor / per
    print(
        f"  {label:<48} {us:7.2f} us/decision  {us - fl:6.2f} above the floor  "
        f"{per_s * per:11,.0f} decisions/s"
    )


def bench(url: str, n: int) -> None:
    client = nbr.client_from_url(url, socket_timeout=2.0)
    client.flushdb()
    # A rate far above what one client reaches: every decision admits and writes.
    limiter = nbr.RedisTokenBucket(client, rate=1_000_000, capacity=1_000_000, prefix="cpu")
    keys = [f"user{i}" for i in range(100)]
    rkeys = [limiter.key(k) for k in keys]
    one_args = limiter._args(1, None, True)
    many_args = limiter._many_args(1, None)
    floor_one = client.register_script(FLOOR_ONE)
    floor_old = client.register_script(FLOOR_ONE_OLD)
    floor_many = client.register_script(FLOOR_MANY)
    calls_one = client.register_script(CALLS_ONE)
    calls_many = client.register_script(CALLS_MANY)
    rkey = limiter.key("k")
    nb = max(1, n // 100)
    print(f"{url}: Redis usec_per_call of EVALSHA, {n} single decisions, {nb} batches of 100")

    f1, f1s, _ = script_usec(client, lambda: floor_one(keys=(rkey,), args=one_args), n)
    report("floor: do-nothing script, same args (single)", f1, f1s, 1, f1)
    fo, fos, _ = script_usec(client, lambda: floor_old(keys=(rkey,), args=OLD_ARGS), n)
    report("floor: 6 args, 4-integer reply (earlier form)", fo, fos, 1, f1)
    c1, c1s, _ = script_usec(client, lambda: calls_one(keys=(rkey,), args=one_args), n)
    report("TIME + GET + SET PX only (single)", c1, c1s, 1, f1)
    u, s, _ = script_usec(client, lambda: limiter.check("k"), n)
    report("RedisTokenBucket.check (admit, write)", u, s, 1, f1)
    u, s, _ = script_usec(client, lambda: limiter.peek("k"), n)
    report("RedisTokenBucket.peek (no write)", u, s, 1, f1)
    full = nbr.RedisTokenBucket(client, rate=1, capacity=1, prefix="cpu-refuse")
    full.allow("k")
    u, s, _ = script_usec(client, lambda: full.check("k"), n)
    report("RedisTokenBucket.check (refused, no write)", u, s, 1, f1)

    fm, fms, _ = script_usec(client, lambda: floor_many(keys=rkeys, args=many_args), nb)
    report("floor: do-nothing script, same args (batch)", fm, fms, 100, fm)
    cm, cms, _ = script_usec(client, lambda: calls_many(keys=rkeys, args=many_args), nb)
    report("TIME + 100 x (GET + SET PX) only (batch)", cm, cms, 100, fm)
    u, s, _ = script_usec(client, lambda: limiter.allow_many(keys), nb)
    report("RedisTokenBucket.allow_many (100 keys, full)", u, s, 100, fm)
    # Each key in debt by a different amount: no two keys share a tat.
    owed = nbr.RedisTokenBucket(client, rate=100, capacity=1_000_000, prefix="cpu-owed")
    for i, k in enumerate(keys):
        owed.check(k, cost=i + 1)
    u, s, _ = script_usec(client, lambda: owed.allow_many(keys), nb)
    report("RedisTokenBucket.allow_many (100 keys, distinct)", u, s, 100, fm)
    # The coalesced batch (AsyncRedisTokenBucket's concurrent decisions): a cost
    # per key, the single script's reply per key (see lua/gcra_batch.lua).
    batch = client.register_script(nbr._GCRA_BATCH)
    for label, lim in (("full", limiter), ("distinct", owed)):
        bkeys = [lim.key(k) for k in keys]
        for form, args in (
            ("one cost", [lim._head[1], b"", 0, lim._interval_us]),
            ("a cost each", [lim._head[1], b"", 0, b""] + [lim._interval_us] * len(bkeys)),
        ):
            u, s, _ = script_usec(client, lambda a=args, k=bkeys: batch(keys=k, args=a), nb)
            report(f"coalesced batch (100 keys, {label}, {form})", u, s, 100, fm)
    client.flushdb()
    client.close()


def _instructions(
    binary: str, script: str, keys: list[bytes], args: tuple[Any, ...], n: int
) -> int:
    """Instructions redis-server runs in its life, with *n* calls of *script* (callgrind)."""
    from redis_server import free_port

    port = free_port()
    with tempfile.TemporaryDirectory(prefix="nanobucket-cg-") as folder:
        out = os.path.join(folder, "callgrind.out")
        proc = subprocess.Popen(
            [
                *("valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", binary),
                *("--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"),
                *("--dir", folder, "--loglevel", "warning"),
                # Its timers run per second, not per call: at the slowest rate
                # they add least to the difference of the two runs.
                *("--hz", "1"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            client = redis.Redis(host="127.0.0.1", port=port, socket_timeout=60)
            deadline = time.monotonic() + 60
            while True:
                try:
                    client.ping()
                    break
                except redis.ConnectionError:
                    if time.monotonic() > deadline:
                        raise
                    time.sleep(0.1)
            run = client.register_script(script)
            for _ in range(n):
                run(keys=keys, args=args)
            with contextlib.suppress(redis.ConnectionError):  # closed as the server went
                client.shutdown(nosave=True)
            proc.wait(120)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        with open(out, encoding="utf-8") as f:
            found = re.search(r"^(?:summary|totals): (\d+)", f.read(), re.M)
        assert found, "no totals in the callgrind output"
        return int(found.group(1))


def bench_callgrind(binary: str, n: int) -> None:
    limiter = nbr.RedisTokenBucket(nbr.client_from_url("redis://127.0.0.1:1"), 1_000_000, 1_000_000)
    one = [limiter.key("k")]
    many = [limiter.key(f"user{i}") for i in range(100)]
    cases = [
        ("floor (single)", FLOOR_ONE, one, limiter._args(1, None, True), 1),
        ("floor, earlier form (single)", FLOOR_ONE_OLD, one, OLD_ARGS, 1),
        ("TIME + GET + SET PX only (single)", CALLS_ONE, one, limiter._args(1, None, True), 1),
        ("lua/gcra.lua (admit, write)", nbr._GCRA, one, limiter._args(1, None, True), 1),
        (
            "lua/lease.lua (take 1, granted)",
            _limits._LEASE,
            one,
            (*limiter._head, b"take", 1, 1, b"", 0),
            1,
        ),
        (
            "lua/reserve.lua (1 token)",
            _limits._RESERVE,
            one,
            limiter._reserve_args(1, None, 0, False),
            1,
        ),
        ("floor (batch of 100)", FLOOR_MANY, many, limiter._many_args(1, None), 100),
        ("TIME + 100 x (GET + SET PX) only", CALLS_MANY, many, limiter._many_args(1, None), 100),
        (
            "lua/gcra_many.lua (100 full keys)",
            nbr._GCRA_MANY,
            many,
            limiter._many_args(1, None),
            100,
        ),
        (
            "lua/gcra_batch.lua (100 full keys, one cost)",
            nbr._GCRA_BATCH,
            many,
            (limiter._head[1], b"", 0, limiter._interval_us),
            100,
        ),
    ]
    print(f"redis-server under callgrind: instructions per decision, {n} and {2 * n} calls")
    for label, script, keys, args, per in cases:
        calls = n if per == 1 else max(1, n // 100)
        short = _instructions(binary, script, keys, args, calls)
        long = _instructions(binary, script, keys, args, 2 * calls)
        print(f"  {label:<48} {(long - short) / calls / per:9.0f} instructions/decision")


# -- the client's CPU per decision (--client) ------------------------------------


def _resp(*parts: bytes | int | str) -> bytes:
    """One command in RESP, as a client library sends it."""
    out = [b"*%d\r\n" % len(parts)]
    for part in parts:
        raw = part if isinstance(part, bytes) else str(part).encode()
        out.append(b"$%d\r\n%s\r\n" % (len(raw), raw))
    return b"".join(out)


def client_cases(url: str) -> dict[str, Callable[[], Any]]:
    """The cases of ``--client``, by name: each a call making one decision (one round trip)."""
    client = nbr.client_from_url(url, socket_timeout=2.0)
    client.flushdb()
    # A rate far above what one client reaches: every decision admits and writes.
    limiter = nbr.RedisTokenBucket(client, 1_000_000, 1_000_000, prefix="cli", timeout=2.0)
    rkey = limiter.key("k")
    args = limiter._args(1, None, True)
    sha = client.script_load(nbr._GCRA)
    own = limiter._client  # the limiter's own client: redis-py's path, as the limiter had it
    script = own.register_script(nbr._GCRA)
    # The floor: the same EVALSHA, pre-encoded, on a bare socket; the reply
    # (":<owed>\r\n", one read) parsed as the limiter needs it.
    where = urlparse(url)
    sock = socket.create_connection((where.hostname or "127.0.0.1", where.port or 6379))
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    request = _resp(b"EVALSHA", sha, 1, rkey, *args)
    send, recv = sock.sendall, sock.recv

    def bare() -> int:
        send(request)
        return int(recv(65536)[1:-2])

    return {
        "floor: bare socket EVALSHA (same shape)": bare,
        "redis-py client.evalsha(sha, 1, key, *args)": lambda: own.evalsha(sha, 1, rkey, *args),
        "redis-py Script(keys=, args=)": lambda: script(keys=(rkey,), args=args),
        "RedisTokenBucket.allow": lambda: limiter.allow("k"),
        "RedisTokenBucket.check": lambda: limiter.check("k"),
    }


def bench_client(url: str, n: int, runs: int) -> None:
    cases = client_cases(url)
    times: dict[str, list[float]] = {name: [] for name in cases}
    for call in cases.values():
        for _ in range(200):  # connections open, scripts loaded
            call()
    for _ in range(runs):  # interleaved: a noisy minute weighs on every case alike
        for name, call in cases.items():
            loop = range(n)
            start = time.process_time()
            for _ in loop:
                call()
            times[name].append((time.process_time() - start) / n * 1e6)
    floor, redispy = (statistics.median(times[name]) for name in list(cases)[:2])
    print(f"{url}: client CPU (process_time) per call, median [range] of {runs} runs x {n}")
    for name, ts in times.items():
        med = statistics.median(ts)
        print(
            f"  {name:<46} {med:6.2f} us [{min(ts):6.2f}-{max(ts):6.2f}]  "
            f"{med / floor:5.2f}x floor  {med / redispy:5.2f}x redis-py evalsha"
        )


def client_loop(url: str, name: str, n: int) -> None:
    """Set up the cases, then call *name* *n* times (run under callgrind by `bench_client_cg`)."""
    call = client_cases(url)[name]
    for _ in range(200):
        call()
    for _ in range(n):
        call()


def bench_client_cg(url: str, n: int) -> None:
    names = list(client_cases(url))
    env = {**os.environ, "PYTHONHASHSEED": "0"}
    print(f"client under callgrind: instructions per call, {n} and {2 * n} calls")
    counts: dict[str, float] = {}
    for name in names:
        totals = []
        for calls in (n, 2 * n):
            with tempfile.TemporaryDirectory(prefix="nanobucket-cg-") as folder:
                out = os.path.join(folder, "callgrind.out")
                subprocess.run(
                    [
                        *("valgrind", "--tool=callgrind", f"--callgrind-out-file={out}"),
                        *(sys.executable, __file__, "--url", url, "--client-loop", name),
                        *("--n", str(calls)),
                    ],
                    env=env,
                    check=True,
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
                with open(out, encoding="utf-8") as f:
                    found = re.search(r"^(?:summary|totals): (\d+)", f.read(), re.M)
                assert found, "no totals in the callgrind output"
                totals.append(int(found.group(1)))
        counts[name] = (totals[1] - totals[0]) / n
    floor, redispy = (counts[name] for name in names[:2])
    for name, count in counts.items():
        print(
            f"  {name:<46} {count:9.0f} instructions  {count / floor:5.2f}x floor  "
            f"{count / redispy:5.2f}x redis-py evalsha"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", help="an existing Redis (default: start one on a free port)")
    parser.add_argument("--n", type=int, default=20_000, help="single decisions per case")
    parser.add_argument("--callgrind", action="store_true", help="count instructions instead")
    parser.add_argument("--client", action="store_true", help="the client's CPU, not Redis's")
    parser.add_argument("--runs", type=int, default=5, help="--client: runs of N calls per case")
    parser.add_argument("--client-loop", help=argparse.SUPPRESS)  # one case, under callgrind
    args = parser.parse_args()
    if args.client_loop:
        client_loop(args.url, args.client_loop, args.n)
    elif args.client:
        n = min(args.n, 2000) if args.callgrind else args.n
        run = (lambda url: bench_client_cg(url, n)) if args.callgrind else None
        on_server(args.url, "bench_redis_cpu", run or (lambda url: bench_client(url, n, args.runs)))
    elif args.callgrind:
        bench_callgrind(redis_server_binary("bench_redis_cpu"), min(args.n, 2000))
    else:
        on_server(args.url, "bench_redis_cpu", lambda url: bench(url, args.n))


if __name__ == "__main__":
    main()
