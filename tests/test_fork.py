"""In-process limiters copied into other processes: a fork warns, a pickle refuses or warns.

A limiter made before a fork is a copy in each child: every process counts on
its own, so N processes admit N times the limit. Each child here reports
through a pipe what it saw: the warnings of its decisions (recorded, so the
parent's warnings-as-errors never sees them) and what it admitted.
"""

from __future__ import annotations

import copy
import json
import os
import pickle
import select
import signal
import time
import warnings
from collections.abc import Callable
from types import ModuleType
from typing import Any

import pytest

import nanobucket as nb

FROZEN = 10**12  # ns: the only instant the injected clocks show
FIX = "SharedKeyedTokenBucket.*RedisTokenBucket"


def frozen() -> int:
    return FROZEN


def in_child(body: Callable[[], Any], timeout: float = 30.0) -> Any:
    """``body()`` in a forked child: its JSON result, or its error re-raised here as a failure.

    The child is killed and reaped if it has not answered within *timeout* s.
    """
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        os.close(r)
        try:
            out = json.dumps({"ok": body()})
        except BaseException as e:  # reported to the parent
            out = json.dumps({"error": repr(e)})
        os.write(w, out.encode())
        os._exit(0)
    os.close(w)
    chunks = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            ready, _, _ = select.select([r], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                os.kill(pid, signal.SIGKILL)
                break
            chunk = os.read(r, 65536)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        os.close(r)
        os.waitpid(pid, 0)
    result = json.loads(b"".join(chunks) or b'{"error": "no answer in time"}')
    assert "error" not in result, result["error"]
    return result["ok"]


def recorded(decide: Callable[[], Any]) -> tuple[Any, list[tuple[str, str, str]]]:
    """``decide()``'s result and the warnings it raised: (category, message, file name)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = decide()
    return result, [(w.category.__name__, str(w.message), w.filename) for w in caught]


# Each verb's first use, on a bucket (b) and on a table (t) at the frozen instant: every
# verb that reads or changes the buckets (but a bucket's tokens(), which reads one word).
BUCKET_VERBS: dict[str, Callable[[Any], object]] = {
    "allow": lambda b: b.allow(),
    "allow_at": lambda b: b.allow_at(FROZEN),
    "check": lambda b: b.check().allowed,
    "peek_at": lambda b: b.peek_at(FROZEN).allowed,
    "reserve": lambda b: b.reserve(),
    "refund": lambda b: b.refund(),
    "acquire": lambda b: b.acquire(timeout=0),
    "reset": lambda b: b.reset(),
    "reconfigure": lambda b: b.reconfigure(rate=2),
}
TABLE_VERBS: dict[str, Callable[[Any], object]] = {
    "allow": lambda t: t.allow("k"),
    "check_at": lambda t: t.check_at("k", FROZEN).allowed,
    "peek": lambda t: t.peek("k").allowed,
    "allow_many": lambda t: list(t.allow_many(["k", "j"])),
    "allow_many_uint64": lambda t: list(t.allow_many(memoryview(bytes(8)).cast("Q"))),
    "reserve": lambda t: t.reserve("k"),
    "refund_at": lambda t: t.refund_at("k", FROZEN),
    "acquire": lambda t: t.acquire("k", timeout=0),
    "tokens_at": lambda t: t.tokens_at("k", FROZEN),
    "len": len,
    "reset": lambda t: t.reset("k"),
    "reconfigure": lambda t: t.reconfigure(rate=2),
}
SPENT = {"allow": 1, "check_at": 1, "peek": 0, "allow_many": 1, "allow_many_uint64": 0}
SPENT.update({"reserve": 1, "refund_at": -1, "acquire": 1, "tokens_at": 0, "len": 0})
SPENT.update({"reset": -4, "reconfigure": 0})  # reset: full again; the rate: tokens kept


@pytest.mark.parametrize("verb", BUCKET_VERBS)
def test_a_bucket_made_before_a_fork_warns_at_its_first_decision_in_the_child(
    impl: ModuleType, verb: str
) -> None:
    b = impl.TokenBucket(rate=1, capacity=10, clock=frozen)
    assert sum(b.allow() for _ in range(10)) == 10  # the parent spends the bucket

    def child() -> object:
        first, seen = recorded(lambda: BUCKET_VERBS[verb](b))
        then, more = recorded(lambda: [BUCKET_VERBS[verb](b), b.allow(), b.tokens()])
        return first, seen, then, more

    first, seen, _, more = in_child(child)
    assert [(category, file) for category, _, file in seen] == [("RuntimeWarning", __file__)]
    assert seen[0][1].startswith("this TokenBucket was made in another process (before a fork)")
    assert "N processes admit up to N times its limit" in seen[0][1]
    assert "SharedKeyedTokenBucket" in seen[0][1] and "RedisTokenBucket" in seen[0][1]
    assert more == []  # once per process
    assert first in (False, -1, None)  # the child's copy was spent too
    assert b.allow() is False and b.tokens() == 0.0  # and the parent: no warning here


@pytest.mark.parametrize("verb", TABLE_VERBS)
def test_a_table_made_before_a_fork_warns_at_its_first_decision_in_the_child(
    impl: ModuleType, verb: str
) -> None:
    t = impl.KeyedTokenBucket(rate=1, capacity=10, clock=frozen)
    assert t.allow("k", cost=4)

    def child() -> object:
        _, seen = recorded(lambda: TABLE_VERBS[verb](t))
        admitted, more = recorded(lambda: sum(t.allow("k") for _ in range(20)))
        return seen, admitted, more

    seen, admitted, more = in_child(child)
    assert [(category, file) for category, _, file in seen] == [("RuntimeWarning", __file__)]
    assert seen[0][1].startswith("this KeyedTokenBucket was made in another process")
    assert more == []
    assert admitted == 6 - SPENT[verb]  # its copy of k's bucket: 6 left, less what the verb spent
    assert t.tokens("k") == 6.0  # the parent's own copy: untouched by the child


def test_forked_copies_admit_the_limit_each_and_every_grandchild_warns(impl: ModuleType) -> None:
    t = impl.KeyedTokenBucket(rate=1, capacity=10, clock=frozen)

    def child() -> object:
        admitted, seen = recorded(lambda: sum(t.allow("k") for _ in range(20)))
        return admitted, len(seen), in_child(grandchild)

    def grandchild() -> object:
        admitted, seen = recorded(lambda: sum(t.allow("k") for _ in range(20)))
        return admitted, len(seen)

    # The parent has not decided yet: the child and the grandchild each get
    # a full copy, the multiplication the warning is about.
    assert in_child(child) == [10, 1, [0, 1]]  # the grandchild's copy was the child's, spent
    assert sum(t.allow("k") for _ in range(20)) == 10


def test_per_process_says_each_copy_is_meant_and_silences_the_warning(impl: ModuleType) -> None:
    b = impl.TokenBucket(rate=1, capacity=10, clock=frozen, per_process=True)
    t = impl.KeyedTokenBucket(rate=1, capacity=10, clock=frozen, per_process=True)
    assert (b.per_process, t.per_process) == (True, True)
    assert impl.TokenBucket(rate=1, capacity=1).per_process is False

    def child() -> object:
        return recorded(lambda: [sum(b.allow() for _ in range(20)), sum(t.allow_many(["k"] * 20))])

    assert in_child(child) == [[10, 10], []]
    with pytest.raises(TypeError, match="per_process must be a bool, not int"):
        impl.TokenBucket(rate=1, capacity=1, per_process=1)
    with pytest.raises(TypeError, match="per_process must be a bool, not str"):
        impl.KeyedTokenBucket(rate=1, capacity=1, per_process="yes")


def test_a_limiter_made_in_the_child_does_not_warn(impl: ModuleType) -> None:
    def child() -> object:
        t = impl.KeyedTokenBucket(rate=1, capacity=2, clock=frozen)
        return recorded(lambda: [t.allow("k"), t.allow("k"), t.allow("k")])

    assert in_child(child) == [[True, True, False], []]


def test_a_layered_limit_warns_for_a_layer_made_before_the_fork(impl: ModuleType) -> None:
    old = impl.KeyedTokenBucket(rate=1, capacity=10, clock=frozen)

    def child() -> object:
        new = impl.TokenBucket(rate=1, capacity=10, clock=frozen)  # the first layer, made here
        limit = nb.all_of(new, old)
        with warnings.catch_warnings():
            # The warning raises: the first layer gets its token back.
            warnings.simplefilter("error")
            try:
                limit.allow("k")
            except RuntimeWarning as e:
                raised = str(e).split(" was made")[0]
            tokens = new.tokens()
            admitted = sum(limit.allow("k") for _ in range(20))  # warned once: no more
        return raised, tokens, admitted

    assert in_child(child) == ["this KeyedTokenBucket", 10.0, 10]


def test_a_table_cannot_be_pickled_and_says_what_to_use(impl: ModuleType) -> None:
    t = impl.KeyedTokenBucket(rate=1, capacity=10)
    message = f"a KeyedTokenBucket cannot be pickled: a copy in another process .*{FIX}"
    with pytest.raises(TypeError, match=message):
        pickle.dumps(t)
    with pytest.raises(TypeError, match="cannot be pickled"):
        copy.copy(t)


def test_a_bucket_unpickled_in_another_process_warns_at_its_first_decision(
    impl: ModuleType,
) -> None:
    b = impl.TokenBucket(rate=1, capacity=10, clock=frozen)
    assert b.allow(cost=4)
    data = pickle.dumps(b)
    here = pickle.loads(data)  # in the process that pickled it: a copy, no warning
    assert [here.tokens(), sum(here.allow() for _ in range(10))] == [6.0, 6]

    def child() -> object:
        made_here = impl.TokenBucket(rate=1, capacity=1, clock=frozen)
        fresh = pickle.loads(data)  # made in this process, from another's pickle
        admitted, seen = recorded(lambda: sum(fresh.allow() for _ in range(10)))
        _, none = recorded(made_here.allow)
        return admitted, [text.split(" (before")[0] for _, text, _ in seen], none

    assert in_child(child) == [6, ["this TokenBucket was made in another process"], []]
    assert b.tokens() == 6.0


def test_a_redis_limiters_local_fallback_is_one_per_process_by_design() -> None:
    # The default fallback (a table of the limit in each process) is meant per
    # process: a Redis limiter made before the fork decides through an outage
    # in the child without a warning (the port below has no server).
    import redis as redis_py

    from nanobucket.redis import RedisTokenBucket

    with socket_free_port() as port:
        client = redis_py.Redis(port=port, socket_connect_timeout=0.2, socket_timeout=0.2)
        limiter = RedisTokenBucket(client, rate=1e-6, capacity=2, timeout=0.2)

        def child() -> Any:
            results, caught = recorded(lambda: [limiter.allow("k") for _ in range(3)])
            return results, [c for c in caught if c[0] == "RuntimeWarning"]

        results, runtime_warnings = in_child(child)
        client.close()
    assert results == [True, True, False]
    assert runtime_warnings == []


class socket_free_port:
    """A loopback port with nothing listening on it (bound, then closed)."""

    def __enter__(self) -> int:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port: int = s.getsockname()[1]
        return port

    def __exit__(self, *exc: object) -> None:
        return None
