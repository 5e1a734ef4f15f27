"""The Lua scripts' writes, exactly: the tat string and the TTL each decision leaves in Redis.

The scripts format integers with ``'%d'`` (a C long, 32 bits on some
platforms), so values past 2**31 go as two halves below 10**8; the batch
script formats each distinct value once. These pin the digits at every
boundary of that, and that a batch leaves what one call per key leaves.
"""

from __future__ import annotations

import random
from typing import Any

import pytest

from nanobucket import redis as nbr
from nanobucket._core._params import NOW_MAX

US = 1000
SLACK = nbr.EXPLICIT_TTL_SLACK_MS
#: ms a PTTL may have run down between the write and the read on a busy machine.
ELAPSED_MS = 2000


@pytest.fixture
def client(redis_url: str) -> Any:
    c = nbr.client_from_url(redis_url, socket_timeout=2.0)
    yield c
    c.close()


def _limiter(client: Any, rate: int, capacity: int) -> nbr.RedisTokenBucket:
    prefix = f"scripts{random.getrandbits(48):x}"
    return nbr.RedisTokenBucket(client, rate=rate, capacity=capacity, prefix=prefix, timeout=2.0)


def _assert_ttl(client: Any, rkey: bytes, ttl_ms: int) -> None:
    pttl = client.pttl(rkey)
    assert ttl_ms - ELAPSED_MS < pttl <= ttl_ms, (pttl, ttl_ms)


@pytest.mark.parametrize(
    "tat_us",
    [
        10_000,  # a short value: '%d' as is
        99_999_999,  # the last value below 10**8
        100_000_000,  # the first value in two halves, the low one all zeros
        2_147_483_647,  # around 2**31 (a 32-bit long's end)
        2_147_483_648,
        1_700_000_000_000_001,  # a low half with leading zeros
        1_700_000_099_999_999,
        NOW_MAX // US + 10_000,  # a token at the latest time
    ],
)
@pytest.mark.parametrize("verb", ["check", "allow_many"])
def test_tat_is_stored_as_its_exact_digits(client: Any, tat_us: int, verb: str) -> None:
    limiter = _limiter(client, rate=100, capacity=200)  # 10 ms a token
    interval_us = 10_000
    now_ns = (tat_us - interval_us) * US
    if verb == "check":
        d = limiter.check_at("k", now_ns)
        assert (d.allowed, d.remaining, d.reset_after_ns) == (True, 199, interval_us * US)
    else:
        assert limiter.allow_many_at(["k"], now_ns) == bytearray([1])
    rkey = limiter.key("k")
    assert client.get(rkey) == str(tat_us).encode()
    _assert_ttl(client, rkey, interval_us // 1000 + 1 + SLACK)


@pytest.mark.parametrize("ttl_ms", [(1 << 31) - 1, 1 << 31, (1 << 31) + 100_000_000])
@pytest.mark.parametrize("verb", ["check", "allow_many"])
def test_a_ttl_past_2_to_the_31_ms_is_exact(client: Any, ttl_ms: int, verb: str) -> None:
    limiter = _limiter(client, rate=1_000_000, capacity=1 << 42)  # 1 us a token
    cost = (ttl_ms - 1 - SLACK) * 1000  # debt in us: TTL = debt // 1000 + 1 + slack
    now_ns = 1_700_000_000_000_000 * US
    if verb == "check":
        assert limiter.check_at("k", now_ns, cost=cost).reset_after_ns == cost * US
    else:
        assert limiter.allow_many_at(["k"], now_ns, cost=cost) == bytearray([1])
    rkey = limiter.key("k")
    assert client.get(rkey) == str(1_700_000_000_000_000 + cost).encode()
    _assert_ttl(client, rkey, ttl_ms)


def test_the_largest_bucket_at_the_latest_time(client: Any) -> None:
    capacity = nbr.TAU_US_MAX // 1_000_000
    limiter = _limiter(client, rate=1, capacity=capacity)
    d = limiter.check_at("k", NOW_MAX, cost=capacity)
    tau_us = capacity * 1_000_000
    assert (d.allowed, d.remaining, d.reset_after_ns) == (True, 0, tau_us * US)
    rkey = limiter.key("k")
    assert client.get(rkey) == str(NOW_MAX // US + tau_us).encode()  # 2**53 - 1 - 313_604
    _assert_ttl(client, rkey, tau_us // 1000 + 1 + SLACK)


def test_a_batch_leaves_what_one_call_per_key_leaves(client: Any) -> None:
    batch = _limiter(client, rate=100, capacity=5)
    single = _limiter(client, rate=100, capacity=5)
    now = 1_700_000_000_123_456_789
    for limiter in (batch, single):
        limiter.check_at("owed", now, cost=3)  # in debt: a tat of its own
        client.set(limiter.key("bad"), "garbage")  # no bucket: an empty one
    # Full keys share one tat (formatted once); a repeated key moves on from its own write.
    keys = ["a", "owed", "a", "b", "bad", "a", "c", "owed", "a", "a", "a"]
    t = now + 5_000_000
    got = batch.allow_many_at(keys, t, cost=1)
    want = bytearray(single.check_at(k, t).allowed for k in keys)
    assert got == want == bytearray([1, 1, 1, 1, 0, 1, 1, 1, 1, 1, 0])
    t_us = t // US
    expected = {
        "a": t_us + 50_000,  # five tokens of 10 ms: full, now empty
        "owed": t_us + 25_000 + 20_000,  # 30 ms owed, 5 ms refilled, two more tokens
        "b": t_us + 10_000,
        "c": t_us + 10_000,
        "bad": t_us + 50_000,  # replaced by an empty bucket
    }
    for key, tat in expected.items():
        stored = client.get(batch.key(key))
        assert stored == client.get(single.key(key)) == str(tat).encode(), key
        _assert_ttl(client, batch.key(key), (tat - t_us) // 1000 + 1 + SLACK)


def test_the_script_replies_the_debt_before_the_decision(client: Any) -> None:
    limiter = _limiter(client, rate=100, capacity=5)  # tau 50 ms
    rkey = limiter.key("k")
    script = client.register_script(nbr._GCRA)
    now_us = 1_700_000_000_000_000
    assert script(keys=(rkey,), args=(50_000, 30_000, now_us, b"1", 0)) == 0  # full, admits 3
    assert client.get(rkey) == str(now_us + 30_000).encode()
    assert script(keys=(rkey,), args=(50_000, 30_000, now_us, b"1", 0)) == 30_000  # refused
    assert client.get(rkey) == str(now_us + 30_000).encode()  # a refusal writes nothing
    assert script(keys=(rkey,), args=(50_000, 10_000, now_us + 5_000, b"0", 0)) == 25_000  # peek
    assert client.get(rkey) == str(now_us + 30_000).encode()


def test_a_debt_past_tau_decides_exactly(client: Any) -> None:
    # An explicit clock that goes back: the bucket owes more than tau.
    limiter = _limiter(client, rate=100, capacity=5)  # 10 ms a token, tau 50 ms
    t = 1_700_000_000_000_000_000
    assert limiter.check_at("k", t, cost=5).allowed
    d = limiter.check_at("k", t - 20 * 1_000_000, cost=2)  # owes 70 ms at that time
    assert (d.allowed, d.remaining, d.retry_after_ns, d.reset_after_ns) == (
        False,
        0,
        40 * 1_000_000,
        70 * 1_000_000,
    )
    d = limiter.peek_at("k", t + 30 * 1_000_000, cost=0)  # owes 20 ms: three tokens
    assert (d.allowed, d.remaining, d.retry_after_ns, d.reset_after_ns) == (
        True,
        3,
        0,
        20 * 1_000_000,
    )


def test_the_single_scripts_slack_is_the_constant() -> None:
    # lua/gcra.lua writes the slack of explicit times rather than taking it
    # as an argument (one argument fewer per decision): the same number.
    assert f"slack = {SLACK}  -- EXPLICIT_TTL_SLACK_MS\n" in nbr._GCRA
