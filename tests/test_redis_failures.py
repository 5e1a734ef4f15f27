"""Redis failing to decide, for real: every state is a redis-server put in it.

Hung (SIGSTOP), dead (stopped) and slow (a script past its busy threshold)
servers, with redis-py's default client (5 s timeouts, 3 retries with
back-off): a decision returns within the limiter's timeout plus a margin,
from the policy, and the breaker opens. Then OOM, READONLY, MASTERDOWN,
LOADING, CLUSTERDOWN, MOVED, ASK, TRYAGAIN: the policy or the fallback
answers, ``reason`` says why, the breaker counts it. Then keys that hold no
bucket. Every test that stops, pauses or blocks a server undoes it in
``finally`` and joins its threads with a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import redis.asyncio
from redis.crc import key_slot

import nanobucket as nb
from nanobucket import redis as nbr

from conftest import ManualClock
from redis_server import (
    RedisServer,
    free_port,
    require_redis_server,
    running_server,
    threads_within,
)

S = 1_000_000_000
MS = 1_000_000
TIMEOUT = 0.1  # the limiters' default timeout
#: A decision returns within TIMEOUT + MARGIN. Generous for a loaded 2-core
#: machine running 8 threads; without the bound these calls took 3 to 59 s.
MARGIN = 0.4
THREADS = 8
#: The timeout of limiters whose Redis fails at once (an error reply): long,
#: so that a loaded machine never turns the error into a timeout.
SLOW_OK = 2.0
#: Hard bound on a whole threaded or async phase: past it the test fails.
PHASE = 15.0


def _timed_in_threads(decide: Callable[[], Any], count: int = THREADS) -> list[tuple[Any, float]]:
    """``decide()`` in *count* threads started together: (result, seconds) each, bounded."""

    def timed(_: int) -> tuple[Any, float]:
        start = time.monotonic()
        d = decide()
        return d, time.monotonic() - start

    return threads_within(count, timed, PHASE)


async def _timed_tasks(decide: Callable[[], Any], count: int = THREADS) -> list[tuple[Any, float]]:
    async def one() -> tuple[Any, float]:
        start = time.monotonic()
        d = await decide()
        return d, time.monotonic() - start

    return await asyncio.wait_for(asyncio.gather(*(one() for _ in range(count))), PHASE)


def _check_bounded(results: list[tuple[Any, float]], reason: str) -> None:
    """Every decision came from the policy in time; the first ones found Redis failing."""
    assert len(results) == THREADS
    for d, elapsed in results:
        assert (d.allowed, d.source) == (False, "policy:closed"), d
        assert d.reason in (reason, "breaker-open"), d
        assert elapsed < TIMEOUT + MARGIN, f"{elapsed:.3f} s for {d}"
    assert any(d.reason == reason for d, _ in results)


def _user_client(server: RedisServer) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=server.port)  # redis-py's defaults


def _limiter(client: Any, **kwargs: Any) -> nbr.RedisTokenBucket:
    kwargs.setdefault("on_error", "closed")
    kwargs.setdefault(
        "breaker", nbr.CircuitBreaker(backoff=60.0, max_backoff=60.0)
    )  # stays open for the test
    return nbr.RedisTokenBucket(client, rate=100, capacity=200, **kwargs)


# -- 1. nothing waits longer than the limiter's timeout -----------------------------------------


def test_default_client_is_given_a_bounded_pool_of_its_own(own_redis_server: RedisServer) -> None:
    client = redis.Redis(host="127.0.0.1", port=own_redis_server.port, socket_timeout=None)
    limiter = _limiter(client, timeout=0.25)
    assert limiter.client is client and limiter.timeout == 0.25
    assert client.get_connection_kwargs()["socket_timeout"] is None  # the user's: untouched
    retry = client.get_connection_kwargs()["retry"]  # redis-py 5.0: None, later 3 or 10 retries
    assert retry is None or (nbr._retries(retry) or 0) > 0
    assert limiter.check("k").source == "redis" and limiter.tokens("k") < 200
    client.set("shared", "yes")  # the user's client keeps working beside it
    assert client.get("shared") == b"yes"
    limiter.close()
    from_url = nbr.RedisTokenBucket.from_url(own_redis_server.url, 100, 200)
    assert nbr.bounded_client(from_url.client, 0.1) is from_url.client  # nothing to derive
    with pytest.raises(ValueError):
        _limiter(client, timeout=0)
    with pytest.raises(TypeError):
        _limiter(client, timeout="1")


def test_a_client_that_decodes_replies_still_works(own_redis_server: RedisServer) -> None:
    # The limiter's pool reads raw replies whatever the client's decode_responses.
    client = redis.Redis(host="127.0.0.1", port=own_redis_server.port, decode_responses=True)
    limiter = _limiter(client, timeout=SLOW_OK)
    assert limiter.allow_many_at(["a", "a", "b"], 0) == bytearray([1, 1, 1])
    d = limiter.check_at("a", 0, cost=198)
    assert (d.allowed, d.remaining, d.source) == (True, 0, "redis")
    assert client.get("shared") is None  # the client itself still decodes
    limiter.close()
    client.close()


@pytest.mark.parametrize("blocking", [True, False])
def test_the_pool_of_its_own_keeps_the_clients_size_and_kind(
    own_redis_server: RedisServer, blocking: bool
) -> None:
    # The only connection is taken while 8 threads decide: from a blocking
    # pool they get it in turn once it is back (at most the timeout later);
    # a plain pool refuses them at once, and the policy decides.
    kind = redis.BlockingConnectionPool if blocking else redis.ConnectionPool
    pool = kind(host="127.0.0.1", port=own_redis_server.port, max_connections=1)
    client = redis.Redis(connection_pool=pool)
    limiter = _limiter(client, timeout=SLOW_OK)
    own = limiter._client.connection_pool
    assert (type(own), own.max_connections) == (kind, 1)
    try:
        taken = own.get_connection()
    except TypeError:  # redis-py < 5.3 wants a command name
        taken = own.get_connection("EVALSHA")
    timer = threading.Timer(0.05, own.release, (taken,))
    if blocking:
        timer.start()
    try:
        # At one explicit instant, so what is left does not depend on how long
        # the threads took (a token refills every 10 ms).
        results = _timed_in_threads(lambda: limiter.check_at("k", 10 * S))
    finally:
        timer.cancel()
        if not blocking:
            own.release(taken)
    outcomes = {(d.source, d.reason) for d, _ in results}
    if blocking:
        assert outcomes == {("redis", None)}
        assert limiter.peek_at("k", 10 * S, 0).remaining == 200 - THREADS
    else:
        assert outcomes == {("policy:closed", "connection"), ("policy:closed", "breaker-open")}
    limiter.close()
    client.close()


def test_hung_redis_threads_return_within_the_timeout(own_redis_server: RedisServer) -> None:
    limiter = _limiter(_user_client(own_redis_server))
    assert limiter.check("warm").source == "redis"  # a connection in the pool already
    own_redis_server.pause()
    try:
        results = _timed_in_threads(lambda: limiter.check("k"))
        start = time.monotonic()
        after = limiter.check("k")
        assert time.monotonic() - start < MARGIN
    finally:
        own_redis_server.resume()
    _check_bounded(results, "timeout")
    assert (after.source, after.reason) == ("policy:closed", "breaker-open")
    assert limiter.breaker.state == "open"
    limiter.close()


def test_hung_redis_the_first_decision_returns_within_the_timeout(
    own_redis_server: RedisServer,
) -> None:
    # The first decision checks the prefix's limit first: on a hung Redis that
    # ask took the whole timeout, then the decision a second one (2 s here).
    timeout = 1.0
    limiter = _limiter(_user_client(own_redis_server), timeout=timeout)
    own_redis_server.pause()
    try:
        start = time.monotonic()
        d = limiter.check("k")
        elapsed = time.monotonic() - start
    finally:
        own_redis_server.resume()
    assert (d.allowed, d.source, d.reason) == (False, "policy:closed", "timeout")
    assert elapsed < timeout + MARGIN, f"{elapsed:.3f} s"
    limiter.close()


def test_hung_redis_the_first_batch_returns_within_the_timeout(
    own_redis_server: RedisServer,
) -> None:
    # The same for a batch: its prefix check is a step of the pipeline.
    timeout = 1.0
    limiter = _limiter(_user_client(own_redis_server), timeout=timeout)
    own_redis_server.pause()
    try:
        start = time.monotonic()
        got = limiter.allow_many(["a", "b"])
        elapsed = time.monotonic() - start
    finally:
        own_redis_server.resume()
    assert got == bytearray([0, 0])  # both refused, by the policy
    assert elapsed < timeout + MARGIN, f"{elapsed:.3f} s"
    limiter.close()


def test_dead_redis_threads_return_within_the_timeout(own_redis_server: RedisServer) -> None:
    sync_failing(own_redis_server, "dead", lambda: _user_client(own_redis_server))


@contextlib.contextmanager
def _busy(server: RedisServer) -> Iterator[None]:
    """A script that never ends runs on *server* meanwhile (others get BUSY)."""
    blocker = redis.Redis(host="127.0.0.1", port=server.port, socket_timeout=PHASE)
    errors: list[BaseException] = []

    def run() -> None:
        try:
            blocker.eval("while true do end", 0)
        except redis.ResponseError as exc:  # "Script killed by user"
            errors.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    probe = server.client()
    try:
        deadline = time.monotonic() + PHASE
        while True:
            try:
                probe.ping()
            except redis.ResponseError as exc:
                if str(exc).startswith("BUSY"):
                    break
                raise
            assert time.monotonic() < deadline, "the script never made the server busy"
            time.sleep(0.01)
        yield
    finally:
        deadline = time.monotonic() + PHASE
        while thread.is_alive() and time.monotonic() < deadline:
            with contextlib.suppress(redis.RedisError):
                probe.script_kill()
            thread.join(0.1)
        probe.close()
        blocker.close()
    assert errors and "killed" in str(errors[0]).lower()


def test_busy_redis_threads_get_the_policy(busy_server: RedisServer) -> None:
    limiter = _limiter(_user_client(busy_server))
    assert limiter.check("warm").source == "redis"
    with _busy(busy_server):
        results = _timed_in_threads(lambda: limiter.check("k"))
    _check_bounded(results, "busy")
    assert limiter.breaker.state == "open"
    limiter.close()


@contextlib.contextmanager
def failing(server: RedisServer, state: str) -> Iterator[str]:
    """*server* hung, dead or busy meanwhile (*state*); yields the reason a decision gets."""
    if state == "busy":
        with _busy(server):
            yield "busy"
    elif state == "hung":
        server.pause()
        try:
            yield "timeout"
        finally:
            server.resume()
    else:
        server.stop()
        yield "connection"


def sync_failing(server: RedisServer, state: str, make_client: Callable[[], Any]) -> None:
    """A limiter on ``make_client()``, *server* then hung, dead or busy: bounded policy."""
    limiter = _limiter(make_client())
    assert limiter.check("warm").source == "redis"
    with failing(server, state) as reason:
        results = _timed_in_threads(lambda: limiter.check("k"))
    _check_bounded(results, reason)
    assert limiter.breaker.state == "open" and limiter.check("k").reason == "breaker-open"
    limiter.close()


def async_failing(server: RedisServer, state: str, make_client: Callable[[], Any]) -> None:
    """An async limiter on ``make_client()``, *server* then hung, dead or busy: bounded policy."""

    async def run() -> None:
        limiter = nbr.AsyncRedisTokenBucket(
            make_client(),
            100,
            200,
            on_error="closed",
            breaker=nbr.CircuitBreaker(backoff=60.0, max_backoff=60.0),
        )
        assert (await limiter.check("warm")).source == "redis"
        with failing(server, state) as reason:
            results = await _timed_tasks(lambda: limiter.check("k"))
        _check_bounded(results, reason)
        assert (await limiter.check("k")).reason == "breaker-open"
        await limiter.aclose()

    asyncio.run(run())


@pytest.mark.parametrize("state", ["hung", "dead", "busy"])
def test_async_default_client_returns_within_the_timeout(
    busy_server: RedisServer, state: str
) -> None:
    async_failing(
        busy_server, state, lambda: redis.asyncio.Redis(host="127.0.0.1", port=busy_server.port)
    )


# -- 2. every way Redis cannot decide goes to the policy ----------------------------------------


def _expect_policy(client: Any, reason: str, key: str = "k") -> None:
    """Redis in a failing state: each verb gets the policy or the fallback, counted once."""
    limiter = _limiter(client, timeout=SLOW_OK)
    d = limiter.check(key)
    assert (d.allowed, d.remaining, d.source, d.reason) == (False, 0, "policy:closed", reason)
    assert limiter.breaker.state == "open"
    fallback = nb.KeyedTokenBucket(rate=1, capacity=2)
    limiter = _limiter(client, timeout=SLOW_OK, fallback=fallback)
    d = limiter.check(key)
    assert (d.allowed, d.remaining, d.source, d.reason) == (True, 1, "fallback", reason)
    assert limiter.breaker.state == "open"
    limiter = _limiter(client, timeout=SLOW_OK, on_error="open")
    assert limiter.allow_many([key, key + "2"]) == bytearray([1, 1])
    assert limiter.breaker.state == "open"
    limiter = _limiter(client, timeout=SLOW_OK, on_error="raise")
    with pytest.raises(nbr.RedisUnavailable) as info:
        limiter.check(key)
    assert nbr.failure_reason(info.value.__cause__) == reason
    leased = nbr.LeasedTokenBucket(
        client,
        timeout=SLOW_OK,
        rate=100,
        capacity=200,
        on_error="closed",
        breaker=nbr.CircuitBreaker(backoff=60.0, max_backoff=60.0),
    )
    d = leased.check(key)
    assert (d.allowed, d.source, d.reason) == (False, "policy:closed", reason)
    assert leased.breaker.state == "open"

    async def run() -> None:
        aclient = redis.asyncio.Redis(**_server_of(client))
        limiter = nbr.AsyncRedisTokenBucket(
            aclient,
            100,
            200,
            timeout=SLOW_OK,
            on_error="closed",
            breaker=nbr.CircuitBreaker(backoff=60.0, max_backoff=60.0),
        )
        d = await limiter.check(key)
        assert (d.source, d.reason) == ("policy:closed", reason)
        await limiter.aclose()

    asyncio.run(run())


def _server_of(client: Any) -> dict[str, Any]:
    kwargs = client.get_connection_kwargs()
    return {"host": kwargs["host"], "port": kwargs["port"]}


def test_out_of_memory(own_redis_server: RedisServer) -> None:
    admin = own_redis_server.client()
    admin.config_set("maxmemory-policy", "noeviction")
    admin.config_set("maxmemory", 1)
    _expect_policy(_user_client(own_redis_server), "oom")
    admin.config_set("maxmemory", 0)
    assert _limiter(_user_client(own_redis_server), timeout=SLOW_OK).check("k").source == "redis"


def test_read_only_replica(own_redis_server: RedisServer) -> None:
    master_args = ("--repl-diskless-sync-delay", "0")  # sync at once, not after 5 s
    with contextlib.closing(RedisServer(require_redis_server(), master_args)) as master:
        master.start()
        admin = own_redis_server.client()
        admin.replicaof("127.0.0.1", master.port)  # a primary demoted after a failover
        deadline = time.monotonic() + PHASE
        while admin.info("replication").get("master_link_status") != "up":
            assert time.monotonic() < deadline, "the replica never synced"
            time.sleep(0.02)
        _expect_policy(_user_client(own_redis_server), "readonly")
        admin.replicaof("NO", "ONE")


def test_master_down(own_redis_server: RedisServer) -> None:
    admin = own_redis_server.client()
    admin.config_set("replica-serve-stale-data", "no")
    admin.replicaof("127.0.0.1", free_port())  # a master that is not there
    _expect_policy(_user_client(own_redis_server), "masterdown")


def test_busy(busy_server: RedisServer) -> None:
    with _busy(busy_server):
        _expect_policy(_user_client(busy_server), "busy")


def test_loading() -> None:
    # Loading 20,000 keys at 200 us each holds the server in LOADING for 4 s.
    with contextlib.closing(
        RedisServer(
            require_redis_server(),
            ("--key-load-delay", "200", "--loading-process-events-interval-bytes", "1024"),
        )
    ) as server:
        server.start()
        admin = server.client()
        admin.eval("for i = 1, 20000 do redis.call('SET', 'fill' .. i, 'x') end", 0)
        admin.save()
        admin.close()
        server.stop()
        server.start(wait=False)
        probe = server.client()
        deadline = time.monotonic() + PHASE
        while True:
            try:
                probe.ping()
                pytest.fail("the server loaded before the test ran")
            except redis.BusyLoadingError:
                break
            except redis.ConnectionError:  # not listening yet
                assert time.monotonic() < deadline
                time.sleep(0.01)
        probe.close()
        _expect_policy(_user_client(server), "loading")


@pytest.fixture
def cluster_node() -> Iterator[RedisServer]:
    """A cluster-enabled redis-server that serves no hash slot yet."""
    yield from running_server("--cluster-enabled", "yes")


def test_cluster_down(cluster_node: RedisServer) -> None:
    _expect_policy(_user_client(cluster_node), "clusterdown")  # no slot is served


def _cmd(client: Any, *args: Any) -> Any:
    return client.execute_command(*args)


def _two_slot_keys(prefix_key: Callable[[str], bytes]) -> tuple[str, str]:
    """Two limiter keys whose Redis keys share one hash slot."""
    seen: dict[int, str] = {}
    for i in range(100_000):
        key = f"u{i}"
        slot = key_slot(prefix_key(key))
        if slot in seen:
            return seen[slot], key
        seen[slot] = key
    raise AssertionError("no two keys share a slot")


def test_moved_ask_and_tryagain(cluster_node: RedisServer) -> None:
    # Two nodes: `owner` serves every slot, `other` none. A plain client on
    # `other` gets MOVED; a slot of `owner` migrating to `other` gives ASK
    # for a missing key and TRYAGAIN for a batch of present and missing keys.
    with contextlib.closing(
        RedisServer(require_redis_server(), ("--cluster-enabled", "yes"))
    ) as other:
        other.start()
        owner_admin, other_admin = cluster_node.client(), other.client()
        _cmd(owner_admin, "CLUSTER", "ADDSLOTSRANGE", 0, 16383)
        _cmd(other_admin, "CLUSTER", "MEET", "127.0.0.1", cluster_node.port)
        other_id = _cmd(other_admin, "CLUSTER", "MYID").decode()
        deadline = time.monotonic() + PHASE
        while _cmd(other_admin, "CLUSTER", "INFO").find(b"cluster_state:ok") < 0:
            assert time.monotonic() < deadline, "the two nodes never formed a cluster"
            time.sleep(0.05)
        _expect_policy(_user_client(other), "moved")

        limiter = _limiter(_user_client(cluster_node), timeout=SLOW_OK)
        present, missing = _two_slot_keys(limiter.key)
        assert limiter.check(present, cost=200).source == "redis"  # 2 s of debt: the key exists
        slot = key_slot(limiter.key(present))
        _cmd(owner_admin, "CLUSTER", "SETSLOT", slot, "MIGRATING", other_id)
        _expect_policy(_user_client(cluster_node), "ask", key=missing)
        batch = _limiter(_user_client(cluster_node), on_error="raise", timeout=SLOW_OK)
        with pytest.raises(nbr.RedisUnavailable) as info:
            batch.allow_many([present, missing])
        assert nbr.failure_reason(info.value.__cause__) == "tryagain"
        assert batch.breaker.state == "open"
        _cmd(owner_admin, "CLUSTER", "SETSLOT", slot, "STABLE")
        owner_admin.close()
        other_admin.close()


# -- keys that hold no bucket -------------------------------------------------------------------


@pytest.fixture
def admin(own_redis_server: RedisServer) -> Iterator[redis.Redis]:
    client = own_redis_server.client()
    yield client
    client.close()


@pytest.mark.parametrize(
    "value", ["garbage", "inf", "-inf", "nan", "-5", "1e300", "9007199254740993", ""]
)
def test_a_key_holding_no_bucket_is_an_empty_bucket_replaced(
    admin: redis.Redis, value: str
) -> None:
    limiter = _limiter(admin, timeout=SLOW_OK)
    rkey = limiter.key("k")
    admin.set(rkey, value)
    d = limiter.peek("k")  # an empty bucket; a peek writes nothing
    assert (d.allowed, d.remaining, d.retry_after_ns, d.source) == (False, 0, 10 * MS, "redis")
    assert d.reset_after_ns == 2 * S and admin.get(rkey) == value.encode()
    start = time.monotonic_ns()
    d = limiter.check("k")  # refused, and the key now holds an empty bucket
    assert (d.allowed, d.remaining, d.retry_after_ns, d.reset_after_ns) == (
        False,
        0,
        10 * MS,
        2 * S,
    )
    assert d.reason is None and limiter.breaker.state == "closed"
    assert float(admin.get(rkey) or 0) > 1e15 and 1000 < admin.pttl(rkey) <= 2001
    # A bucket again, refilling from empty since the check: owed 2 s less the
    # time since (a token every 10 ms, so a loaded machine may already see one).
    d = limiter.peek("k")
    waited = time.monotonic_ns() - start
    owed = d.reset_after_ns - (10 * MS if d.allowed else 0)
    assert 2 * S - waited - 1000 <= owed <= 2 * S
    assert d.allowed == (owed <= 2 * S - 10 * MS)
    time.sleep(0.03)
    assert limiter.allow("k")


def test_a_key_of_another_type_is_an_empty_bucket_replaced(admin: redis.Redis) -> None:
    limiter = _limiter(admin, timeout=SLOW_OK)
    for verb in ("check", "allow_many", "lease", "peek_at"):
        rkey = limiter.key(verb)
        admin.delete(rkey)
        admin.hset(rkey, "field", "1")
        if verb == "check":
            assert not limiter.check(verb).allowed
        elif verb == "allow_many":
            assert limiter.allow_many([verb, "fresh-" + verb]) == bytearray([0, 1])
        elif verb == "lease":
            leased = nbr.LeasedTokenBucket(
                admin, rate=100, capacity=200, on_error="closed", timeout=SLOW_OK
            )
            d = leased.check(verb)
            assert (d.allowed, d.source, d.reason) == (False, "redis", None)
        else:
            d = limiter.peek_at(verb, 10**15)
            assert (d.allowed, d.remaining, d.source) == (False, 0, "redis")
            assert admin.type(rkey) == b"hash"  # a peek writes nothing
            continue
        assert admin.type(rkey) == b"string", verb
    assert limiter.breaker.state == "closed"


# -- 6. around an outage: the fallback resumes from Redis, and Redis is back within 0.1 s ---------


def test_the_fallback_resumes_from_what_this_process_last_saw(
    own_redis_server: RedisServer,
) -> None:
    # Two processes' worth: a fallback with half the capacity. Before the outage
    # Redis admitted alice's whole burst (200) and bob 50 of 200: the fallback of
    # this process starts alice empty and bob at half of his 150 left, so the two
    # processes together admit no burst twice; carol, never seen here, finds the
    # fallback as it is.
    fallback = nb.KeyedTokenBucket(rate=0.0005, capacity=100)  # no refill during the test
    limiter = nbr.RedisTokenBucket(
        _user_client(own_redis_server),
        rate=0.001,
        capacity=200,
        fallback=fallback,
        breaker=nbr.CircuitBreaker(backoff=60.0, max_backoff=60.0),
    )
    assert limiter.allow("alice", cost=200) and limiter.allow("bob", cost=50)
    own_redis_server.stop()
    try:
        decisions = [limiter.check(user) for user in ("alice", "bob", "carol")]
    finally:
        own_redis_server.start()
    assert [(d.allowed, d.remaining, d.source) for d in decisions] == [
        (False, 0, "fallback"),
        (True, 74, "fallback"),  # 150 * 100 / 200 = 75, less this one
        (True, 99, "fallback"),
    ]
    limiter.close()


def test_the_fallback_resumes_on_the_breakers_clock(redis_url: str) -> None:
    # Redis admitted alice's whole burst (10 at 1/s); 4 s later on the breaker's
    # clock it fails: 4 tokens came back, so the fallback starts alice at 4.
    clock = ManualClock()
    breaker = nbr.CircuitBreaker(backoff=60.0, clock=clock)
    fallback = nb.KeyedTokenBucket(rate=1, capacity=10, clock=clock)
    limiter = nbr.RedisTokenBucket(
        redis.Redis.from_url(redis_url),
        rate=1,
        capacity=10,
        prefix=f"resume-{uuid.uuid4().hex}",
        fallback=fallback,
        breaker=breaker,
        timeout=SLOW_OK,
    )
    try:
        assert limiter.check("alice", cost=10).source == "redis"
        clock.advance(4 * S)
        breaker.record_failure()
        d = limiter.check("alice")
        assert (d.allowed, d.remaining, d.source) == (True, 3, "fallback")
    finally:
        limiter.close()


def test_a_limiter_with_a_clock_backs_off_on_it(redis_url: str) -> None:
    # No breaker given: the limiter's own clock= times the back-off and the probe.
    clock = ManualClock()
    limiter = nbr.LeasedTokenBucket(
        redis.Redis.from_url(redis_url), rate=1, capacity=10, clock=clock, on_error="closed"
    )
    try:
        assert limiter.breaker.clock is clock
        limiter.breaker.record_failure()
        assert limiter.breaker.retry_in_ns() == 100 * MS
        clock.advance(100 * MS - 1)
        assert (limiter.breaker.state, limiter.breaker.retry_in_ns()) == ("open", 1)
        clock.advance(1)
        assert limiter.breaker.state == "half-open"
    finally:
        limiter.close()


def test_the_breaker_probes_every_tenth_of_a_second_by_default() -> None:
    # However long Redis has failed, the next probe is at most 0.1 s away: decisions
    # are Redis's again within 0.1 s of its answering (the back-off used to double
    # to 5 s).
    clock = ManualClock()
    b = nbr.CircuitBreaker(clock=clock)
    for _ in range(50):  # five seconds of failed probes
        b.record_failure()
        assert b.retry_in_ns() == 100 * MS
        clock.advance(100 * MS)
        assert b.allow_request()
    b.record_success()
    assert (b.state, b.recoveries) == ("closed", 1)
