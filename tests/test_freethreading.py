"""Free-threading stress: eight threads use every verb of one bucket and one table.

The clock is frozen, so no token is ever created by time: every token a
bucket lost was spent by some thread and not given back. Each thread
counts what it was granted and what it refunded (only tokens it holds), and
at the end the buckets' own counts must agree exactly. A lost update (two
threads spending from the same word, one write lost) or a double spend
breaks the equality; on the free-threaded build (3.14t, run by the wheels
workflow with PYTHON_GIL=0) this is where a race would show.

On a GIL build it runs too, with the switch interval at 1 us so that
threads are interleaved inside the verbs as often as the interpreter can.
"""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
import threading
from types import ModuleType

import pytest

from conftest import ManualClock, run_threads

THREADS = 8
OPS = 2_000  # per thread, per limiter
FROZEN = 10**12  # ns: the only instant the clock shows
BUCKET_CAPACITY = 4_000
TABLE_CAPACITY = 1_500
HOT = ["hot0", "hot1", "hot2", "hot3"]
MAX_KEYS = 64
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
GIL_OFF = not getattr(sys, "_is_gil_enabled", lambda: True)()  # a free-threaded build, running so


class Ledger:
    """One thread's account: tokens granted, tokens refunded, costs still held."""

    def __init__(self) -> None:
        self.spent = 0
        self.refunded = 0
        self.rejected = 0
        self.held: list[int] = []

    def grant(self, allowed: bool, cost: int) -> None:
        if allowed:
            self.spent += cost
            self.held.append(cost)
        else:
            self.rejected += 1


def test_every_verb_of_one_bucket_conserves_tokens(impl: ModuleType, clock: ManualClock) -> None:
    clock.now = FROZEN
    b = impl.TokenBucket(rate=1, capacity=BUCKET_CAPACITY, clock=clock)
    ledgers = [Ledger() for _ in range(THREADS)]

    def work(i: int) -> None:
        me = ledgers[i]
        for n in range(OPS):
            cost = 1 + (n + i) % 3
            op = (n * 7 + i) % 9
            if op == 0:
                me.grant(b.allow(cost), cost)
            elif op == 1:
                me.grant(b.allow_at(FROZEN, cost), cost)
            elif op == 2:
                d = b.check(cost)
                assert d.limit == BUCKET_CAPACITY and 0 <= d.remaining <= BUCKET_CAPACITY
                assert d.retry_after_ns == 0 if d.allowed else d.retry_after_ns > 0
                me.grant(d.allowed, cost)
            elif op == 3:
                d = b.peek(cost)
                assert 0 <= d.remaining <= BUCKET_CAPACITY
            elif op == 4:
                assert 0.0 <= b.tokens() <= BUCKET_CAPACITY
            elif op == 5:
                me.grant(b.acquire(cost, timeout=0), cost)
            elif op == 6 and me.held:
                # Give back tokens this thread holds: the bucket never goes
                # past full, so the refund is exact.
                back = me.held.pop()
                b.refund(back)
                me.refunded += back
            elif op == 7:
                assert b.tokens_at(FROZEN) <= BUCKET_CAPACITY
            else:
                me.grant(b.check_at(FROZEN, cost).allowed, cost)

    run_threads(THREADS, work)
    net = sum(me.spent for me in ledgers) - sum(me.refunded for me in ledgers)
    assert 0 < net <= BUCKET_CAPACITY  # never more than capacity at one instant
    assert b.tokens() == BUCKET_CAPACITY - net  # exactly what the threads kept
    assert sum(me.rejected for me in ledgers) > 0  # the bucket did run dry
    assert b.allow(BUCKET_CAPACITY - net + 1) is False
    assert b.allow(BUCKET_CAPACITY - net) is True  # and exactly the rest is there


def test_every_verb_of_one_table_conserves_tokens_while_keys_churn(
    impl: ModuleType, clock: ManualClock
) -> None:
    clock.now = FROZEN
    t = impl.KeyedTokenBucket(rate=1, capacity=TABLE_CAPACITY, max_keys=MAX_KEYS, clock=clock)
    ledgers = [{key: Ledger() for key in HOT} for _ in range(THREADS)]
    churned = [0] * THREADS

    def work(i: int) -> None:
        mine = ledgers[i]
        for n in range(OPS):
            key = HOT[(n + i) % len(HOT)]
            me = mine[key]
            cost = 1 + (n * 5 + i) % 3
            op = (n * 7 + i) % 11
            if op == 0:
                me.grant(t.allow(key, cost), cost)
            elif op == 1:
                me.grant(t.allow_at(key, FROZEN, cost), cost)
            elif op == 2:
                d = t.check(key, cost)
                assert d.limit == TABLE_CAPACITY and 0 <= d.remaining <= TABLE_CAPACITY
                me.grant(d.allowed, cost)
            elif op == 3:
                assert 0 <= t.peek(key, cost).remaining <= TABLE_CAPACITY
            elif op == 4:
                assert 0.0 <= t.tokens(key) <= TABLE_CAPACITY
            elif op == 5:
                me.grant(t.acquire(key, cost, timeout=0), cost)
            elif op == 6 and me.held:
                back = me.held.pop()
                t.refund(key, back)
                me.refunded += back
            elif op == 7:
                # One call for every hot key, in order, at the frozen instant.
                for k, ok in zip(HOT, t.allow_many(HOT, cost)):
                    mine[k].grant(bool(ok), cost)
            elif op == 8:
                # Churn: new keys at an earlier explicit time fill the table
                # and force sweeps. Their buckets owe less than any hot key's
                # (which live at FROZEN), so a sweep forgives them, never a
                # hot key, and the hot ledgers stay exact.
                batch = [f"c{i}-{n}-{j}" for j in range(4)]
                assert t.allow_at(batch[0], 0) is True
                assert t.allow_many_at(batch[1:], 0) == bytearray(b"\x01\x01\x01")
                churned[i] += 4
            elif op == 9:
                assert len(t) <= MAX_KEYS
            else:
                me.grant(t.check_at(key, FROZEN, cost).allowed, cost)

    run_threads(THREADS, work)
    for key in HOT:
        spent = sum(mine[key].spent for mine in ledgers)
        refunded = sum(mine[key].refunded for mine in ledgers)
        net = spent - refunded
        assert 0 < net <= TABLE_CAPACITY, key
        assert t.tokens(key) == TABLE_CAPACITY - net, key
        assert sum(mine[key].rejected for mine in ledgers) > 0, key
    assert sum(churned) > 10 * MAX_KEYS  # so the table was swept many times
    assert len(t) <= MAX_KEYS


def test_free_threaded_build_keeps_the_gil_off() -> None:
    """Importing every extension must not turn the GIL back on (3.14t only)."""
    if not FREE_THREADED:
        pytest.skip("a GIL build: nothing to turn off")
    env = {k: v for k, v in os.environ.items() if k != "PYTHON_GIL"}
    code = (
        "import sys, warnings; warnings.simplefilter('error');"
        "import nanobucket, nanobucket._core._bucket_c, nanobucket.bench._floor;"
        "import importlib.util as u;"
        "u.find_spec('nanobucket._core._shared_c') and __import__('nanobucket._core._shared_c');"
        "print(sys._is_gil_enabled())"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert out.stdout.strip() == "False", out.stderr


class _ClearsTheBatch:
    """A key whose hash empties the list being decided (as another thread could)."""

    def __init__(self, batch: list[object]) -> None:
        self.batch = batch

    def __hash__(self) -> int:
        self.batch.clear()  # drops the last reference to every other key
        return 1


def test_allow_many_decides_a_snapshot_of_a_list_that_changes(impl: ModuleType) -> None:
    # The Cython table once read the list's item pointers after a key's
    # __hash__ had freed them (a segfault); both now decide the list as it was.
    t = impl.KeyedTokenBucket(rate=1, capacity=1)
    batch: list[object] = [_ClearsTheBatch([])]
    batch[0].batch = batch  # type: ignore[attr-defined]
    batch.extend(object() for _ in range(2_000))
    assert t.allow_many_at(batch, FROZEN) == bytearray(b"\x01" * 2_001)
    assert batch == []


@pytest.mark.skipif(
    not GIL_OFF,
    reason="needs a free-threaded interpreter running with the GIL off "
    "(sys._is_gil_enabled() is False): under the GIL a reconfigure cannot interleave with a verb",
)
@pytest.mark.parametrize("spenders", [1, 3, 7])
def test_reconfigure_racing_the_verbs_keeps_every_token(
    impl: ModuleType, clock: ManualClock, spenders: int
) -> None:
    """One thread changes the rate 1 -> 2 -> 4 -> 1 at a frozen instant while others spend.

    The tokens carry over exactly at each change (1e9, 5e8 and 2.5e8 ns per
    token), and a frozen clock refills nothing: exactly the capacity is
    admitted, whatever the interleaving. A decision made with one rate on a
    word carried over to another gains or loses tokens.
    """
    clock.now = FROZEN
    for _ in range(20):
        b = impl.TokenBucket(rate=1, capacity=3_000, clock=clock)
        changed = threading.Event()
        admitted = [0] * spenders

        def work(i: int) -> None:
            if i == spenders:  # the last thread reconfigures
                for n in range(300):
                    b.reconfigure(rate=(2, 4, 1)[n % 3])
                changed.set()
                return
            while True:
                done = changed.is_set()  # read first: a refusal after it is final
                verb = (b.allow, lambda: b.check().allowed, lambda: b.allow_at(FROZEN))[i % 3]
                if verb():
                    admitted[i] += 1
                elif done:
                    return

        run_threads(spenders + 1, work)
        assert (sum(admitted), b.tokens(), b.rate) == (3_000, 0.0, 1)
