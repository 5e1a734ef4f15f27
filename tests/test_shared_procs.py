"""SharedKeyedTokenBucket across real forked processes: one limit for all of them."""

from __future__ import annotations

import faulthandler
import json
import mmap
import os
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nanobucket.shared import SharedKeyedTokenBucket

from conftest import NEEDS_SHARED_TABLE

pytestmark = NEEDS_SHARED_TABLE

S = 1_000_000_000


def run_children(n: int, body: Callable[[int], object], timeout: float = 30.0) -> list[Any]:
    """Fork *n* children running ``body(i)``; return their JSON results (decoded), in order.

    A child that raises reports the error, which fails the test; a child that
    dies reports how (its signal, and the traceback faulthandler wrote to the
    same pipe). Every child is reaped (and killed if past *timeout*) before
    returning.
    """
    pipes, pids = [], []
    for i in range(n):
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: never return into pytest
            os.close(r)
            # A crash here tells the parent where (pytest's faulthandler writes
            # to the terminal, apart from the failing test).
            faulthandler.enable(w)
            try:
                out = json.dumps({"ok": body(i)})
            except BaseException as e:  # reported to the parent
                out = json.dumps({"error": repr(e)})
            os.write(w, out.encode())
            os._exit(0)
        os.close(w)
        pipes.append(r)
        pids.append(pid)
    results = []
    deadline = time.monotonic() + timeout
    for r, pid in zip(pipes, pids):
        chunks = []
        while True:
            chunk = os.read(r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(r)
        while (status := os.waitpid(pid, os.WNOHANG)) == (0, 0):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)
        got = b"".join(chunks)
        try:
            result = json.loads(got)
        except ValueError:
            how = os.waitstatus_to_exitcode(status[1])
            result = {"error": f"no result (exit {how}): {got.decode(errors='replace')}"}
        assert "error" not in result, result["error"]
        results.append(result["ok"])
    return results


def spin_until(t: int) -> None:
    while time.monotonic_ns() < t:
        pass


def test_table_created_before_fork_is_used_by_children(tmp_path: Path) -> None:
    path = tmp_path / "t"
    with SharedKeyedTokenBucket.create(path=path, rate=1, capacity=10) as t:
        assert t.allow_at("parent", 0, cost=4)

        def child(i: int) -> object:
            if i % 2:  # half inherit the mapping, half open the file by path
                u = SharedKeyedTokenBucket.open(path=path)
            else:
                u = t
            own = sum(u.allow_at(f"child-{i}", 0) for _ in range(20))
            common = sum(u.allow_at("parent", 0) for _ in range(20))
            return [own, common]

        results = run_children(4, child)
        assert [own for own, _ in results] == [10, 10, 10, 10]
        assert sum(common for _, common in results) == 6  # 10 - the parent's 4
        assert t.tokens_at("parent", 0) == 0.0
        assert [t.allow_at(f"child-{i}", 0) for i in range(4)] == [False] * 4
        assert t.allow_at("parent", S) is True  # one token back after 1 s


def test_frozen_time_admits_exactly_capacity_in_total(tmp_path: Path) -> None:
    # 80,000 requests at one instant against 50,000 tokens, from 4 processes
    # at once: every CAS race between them is lost or won, never both.
    with SharedKeyedTokenBucket.create(path=tmp_path / "t", rate=1, capacity=50_000) as t:
        start = time.monotonic_ns() + 300_000_000  # every child starts together

        def child(i: int) -> object:
            spin_until(start)
            admitted = 0
            for _ in range(20_000):
                admitted += t.allow_at("hot", 10 * S)
            return admitted

        counts = run_children(4, child)
        assert sum(counts) == 50_000
        assert t.check_at("hot", 10 * S).retry_after_ns == S
        assert t.tokens_at("hot", 10 * S) == 0.0


def hammer(
    t: SharedKeyedTokenBucket, start: int, end: int, counter: memoryview | None, i: int
) -> list[int]:
    """Call ``allow("hot")`` from *start* to *end*; [admitted, first call ns, last call ns]."""
    spin_until(start)
    admitted = 0
    first = time.monotonic_ns()
    now = first
    while now < end:
        if t.allow("hot"):
            admitted += 1
            if counter is not None:
                counter[i] = admitted
        now = time.monotonic_ns()
    return [admitted, first, now]


def bound(t: SharedKeyedTokenBucket, t0: int, t1: int) -> int:
    """The most GCRA admits in [t0, t1] from a full bucket: capacity + (t1 - t0) / interval."""
    return t.capacity + (t1 - t0) // t.interval_ns


def test_four_processes_share_one_limit_on_the_real_clock(tmp_path: Path) -> None:
    # Demand (millions/s) far above the rate: the table decides alone. A
    # process descheduled for a moment loses nothing, since tokens wait in
    # the bucket (up to 1 s of them: on 2 busy cores all four processes can
    # stall together for over 0.2 s), so the lower bound is not a timing bet.
    with SharedKeyedTokenBucket.create(path=tmp_path / "t", rate=5000, capacity=5000) as t:
        start = time.monotonic_ns() + 300_000_000
        end = start + 2 * S
        results = run_children(4, lambda i: hammer(t, start, end, None, i))
        counts = [r[0] for r in results]
        most = bound(t, min(r[1] for r in results), max(r[2] for r in results))
        # Every process asks between the last first call and the first last
        # call; one late to see `end` asks once more, not at the rate.
        least = bound(t, max(r[1] for r in results), min(r[2] for r in results))
        assert sum(counts) <= most
        assert sum(counts) >= 0.98 * least
        assert all(c > 0 for c in counts), counts


def test_a_worker_killed_mid_run_leaves_the_table_working(tmp_path: Path) -> None:
    # Each child publishes its admitted count in shared memory after every
    # admit, so the count of the one killed is known to within the one
    # request it may have been killed between admitting and counting.
    counters = mmap.mmap(-1, 8 * 4)
    counter = memoryview(counters).cast("q")
    try:
        # Capacity: 1 s of tokens, as above.
        with SharedKeyedTokenBucket.create(path=tmp_path / "t", rate=5000, capacity=5000) as t:
            start = time.monotonic_ns() + 300_000_000
            end = start + 1_500_000_000
            victim_r, victim_w = os.pipe()
            victim = os.fork()
            if victim == 0:
                os.close(victim_r)
                try:
                    hammer(t, start, end + 10 * S, counter, 0)
                finally:
                    os._exit(1)
            os.close(victim_w)

            at_kill: list[int] = []

            def killer_and_workers(i: int) -> object:
                if i == 0:  # kill the victim mid-run, then report who had counted what
                    spin_until(start + 500_000_000)
                    os.kill(victim, signal.SIGKILL)
                    return [counter[j] for j in range(4)]
                return hammer(t, start, end, counter, i)

            results = run_children(4, killer_and_workers)
            _, status = os.waitpid(victim, 0)
            os.close(victim_r)
            assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
            at_kill = results[0]
            survivors = results[1:]
            victim_count = counter[0]
            assert victim_count == at_kill[0] and victim_count > 0
            for i, r in enumerate(survivors, start=1):
                assert r[0] > at_kill[i]  # went on after the kill
            total = victim_count + sum(r[0] for r in survivors)
            most = bound(t, start, max(r[2] for r in survivors))
            least = bound(t, max(r[1] for r in survivors), min(r[2] for r in survivors))
            assert total <= most
            assert total + 1 >= 0.98 * least
            assert t.tokens("hot") < t.capacity  # still consistent and in use
            assert t.allow_at("fresh", 0)
    finally:
        counter.release()
        counters.close()


def over_the_bound(times: list[int], capacity: int, interval_ns: int) -> int:
    """Windows [t_i, t_j] of sorted admission *times* holding more than capacity + T*rate."""
    times = sorted(times)
    over = 0
    for i in range(len(times)):
        for j in range(i + capacity, len(times)):
            # j - i + 1 admits over t_j - t_i: at most capacity + that many intervals
            if (j - i + 1 - capacity) * interval_ns > times[j] - times[i]:
                over += 1
    return over


def test_keys_keep_their_limit_while_slots_churn_and_a_worker_stops(tmp_path: Path) -> None:
    # Four slots for twelve keys, asked in turn, whose buckets refill in 3 ms
    # (full again when their turn comes back): new keys keep reclaiming
    # slots, at times read from the real clock just before each call (so the
    # processes' times straddle refills), while one child stops and resumes
    # another (SIGSTOP at any instant, mid-claim included). Every admission
    # is checked against the bound, key by key.
    pids_map = mmap.mmap(-1, 8 * 3)
    pids = memoryview(pids_map).cast("q")
    try:
        with SharedKeyedTokenBucket.create(
            path=tmp_path / "t", rate=1000, capacity=3, max_keys=2
        ) as t:
            start = time.monotonic_ns() + 300_000_000
            end = start + 1_000_000_000

            def child(i: int) -> object:
                pids[i] = os.getpid()
                spin_until(start)
                if i == 0:  # stop worker 2 for 5 ms in every 15
                    while time.monotonic_ns() < end:
                        time.sleep(0.01)
                        os.kill(pids[2], signal.SIGSTOP)
                        time.sleep(0.005)
                        os.kill(pids[2], signal.SIGCONT)
                    return []
                admitted = []
                while (now := time.monotonic_ns()) < end:
                    # Both workers on one key each 0.5 ms, so both insert it at once.
                    key = now // 500_000 % 12
                    if t.allow_at(key, now):
                        admitted.append([key, now])
                return admitted

            results = run_children(3, child)
    finally:
        pids.release()
        pids_map.close()
    per_key: dict[int, list[int]] = {}
    for admitted in results:
        for key, now in admitted:
            per_key.setdefault(key, []).append(now)
    assert sum(len(v) for v in per_key.values()) > 1000  # the workers did run
    over = {k: n for k, v in per_key.items() if (n := over_the_bound(v, 3, t.interval_ns))}
    assert over == {}
