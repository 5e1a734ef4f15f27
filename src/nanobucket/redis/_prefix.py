"""One limit per prefix: limiters sharing a prefix must keep their buckets in the same terms.

A bucket in Redis is a number (its theoretical arrival time) that means
something only under one interval and one capacity: two limiters with
different limits on one prefix read each other's buckets in their own
terms, and each admits what neither was set to. So the first limiter to
talk to Redis records its terms, ``"<interval_us> <tau_us>"`` as the
scripts use them, under ``<prefix>:params`` (a script: set if missing, in
one step, so limiters starting together with the same limit all pass), and
every limiter compares its own with them before its first decision.

The check is made once per limiter, lazily: until it passes, the scripts
that decide (`GUARDED`) are wrapped in a `Checked` that runs it first,
inside the call it guards (its timeout, its breaker); once it passes the
limiter holds the plain scripts again and no decision pays for it. A check
Redis cannot answer does not stop the decision, which goes on unchecked
(and gets the failure policy if Redis cannot make it either); the check is
tried again a second later. On a Redis Cluster the params key is one key of
its own slot, read once: a shard that is down delays the check, never the
decisions of the other shards.
`reconfigure(migrate=True)` writes the new terms; ``migrate=False`` checks
them again before the next decision.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Generator
from importlib.resources import files
from typing import Any

from . import _clients

__all__ = (
    "GUARDED",
    "Checked",
    "PrefixConflict",
    "conflict",
    "guard",
    "params_key",
    "params_value",
    "release",
)

#: Records a prefix's limit if none is, and returns the one recorded (lua/params.lua).
PARAMS = files(__package__).joinpath("lua/params.lua").read_text(encoding="utf-8")
#: Seconds before a check Redis could not answer is tried again.
RETRY_S = 1.0
#: The scripts that read or write buckets in the limiter's terms.
GUARDED = ("_script", "_many_script", "_batch_script", "_give_script", "_reserve_script")


class PrefixConflict(ValueError):
    """A limiter's prefix in Redis holds the buckets of another limit: raised by its first
    decision, never answered by the failure policy (a limit set wrong, not Redis down).

    Two limiters with different limits need two prefixes; to change the limit
    of a prefix, ``reconfigure(rate=..., capacity=..., migrate=True)``.

    >>> issubclass(PrefixConflict, ValueError)   # a bad argument, in effect: the prefix
    True
    """


# Named where users import it from, as tracebacks print it.
PrefixConflict.__module__ = "nanobucket.redis"


def params_value(interval_us: int, tau_us: int) -> bytes:
    """What a limiter records under its prefix: its interval and tau, in us.

    >>> params_value(10_000, 2_000_000)
    b'10000 2000000'
    """
    return b"%d %d" % (interval_us, tau_us)


def _limit(value: bytes) -> str:
    """A stored value in words: ``rate 100/s, capacity 200`` (or the bytes, if not ours)."""
    try:
        interval_us, tau_us = (int(part) for part in value.split())
        if interval_us <= 0 or tau_us % interval_us:
            raise ValueError
    except ValueError:
        return f"{value!r}"
    return f"rate {1e6 / interval_us:g}/s, capacity {tau_us // interval_us}"


def conflict(limiter: Any, stored: bytes) -> PrefixConflict:
    """The error of *limiter* finding *stored* (another limit) under its prefix.

    >>> class L: _prefix, _interval_us, _tau_us = b"api:{", 20_000, 1_000_000
    >>> print(conflict(L(), b"10000 2000000"))  # doctest: +NORMALIZE_WHITESPACE
    prefix 'api' in Redis holds the buckets of another limit (rate 100/s, capacity 200,
    in b'api:params'), not this limiter's (rate 50/s, capacity 50): limiters with different
    limits must not share a prefix. Give this one a prefix of its own (prefix=...), or, to
    change the limit of every limiter on 'api', call reconfigure(rate=..., capacity=...,
    migrate=True) on one of the stored limit
    """
    prefix = limiter._prefix[:-2].decode("utf-8")
    mine = params_value(limiter._interval_us, limiter._tau_us)
    return PrefixConflict(
        f"prefix {prefix!r} in Redis holds the buckets of another limit ({_limit(stored)}, "
        f"in {params_key(limiter)!r}), not this limiter's ({_limit(mine)}): limiters with "
        f"different limits must not share a prefix. Give this one a prefix of its own "
        f"(prefix=...), or, to change the limit of every limiter on {prefix!r}, call "
        f"reconfigure(rate=..., capacity=..., migrate=True) on one of the stored limit"
    )


def params_key(limiter: Any) -> bytes:
    """``<prefix>:params``: never a bucket's key (those are ``<prefix>:{<key>}``)."""
    prefix: bytes = limiter._prefix
    return prefix[:-2] + b":params"


class Checked:
    """A script of a limiter whose prefix is not checked yet: the check, then the script.

    Called as the script is (sync: its reply; asyncio: a coroutine), and
    seen through by `evalsha_pipeline` (`steps`, then `inner`).
    """

    __slots__ = ("ask", "inner", "limiter")

    def __init__(self, limiter: Any, inner: Any) -> None:
        self.limiter = limiter
        self.inner = inner  # the script itself
        # On the script's own client: the same connections and timeouts as the call it guards.
        self.ask = inner.registered_client.register_script(PARAMS)

    def _due(self) -> bool:
        """Whether to check now: not within `RETRY_S` of a check Redis could not answer."""
        retry_at: float = self.limiter._prefix_retry_at
        return time.monotonic() >= retry_at

    def _unanswered(self) -> None:
        self.limiter._prefix_retry_at = time.monotonic() + RETRY_S

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)  # sha, script: the script's own

    def _ask(self) -> Any:
        """The check's one call: the script that records the limit, or reads the one stored."""
        limiter = self.limiter
        mine = params_value(limiter._interval_us, limiter._tau_us)
        return self.ask(keys=(params_key(limiter),), args=(mine,))

    def _passed(self, stored: bytes) -> None:
        limiter = self.limiter
        if stored != params_value(limiter._interval_us, limiter._tau_us):
            raise conflict(limiter, stored)
        release(limiter)

    def steps(self) -> Generator[Any, Any, None]:
        """The check as a step of client calls (see `_limits.drive`), for a pipeline.

        A sync client's error reaches it here, and the batch goes on unchecked
        unless the ask timed out (the caller's time is spent: the batch fails to
        the policy); an asyncio one's is raised where the call is awaited,
        failing the batch.
        """
        if not self._due():
            return
        try:
            stored = yield self._ask()
        except _clients.UNAVAILABLE as err:
            self._unanswered()
            if _clients.class_reason(err) == "timeout":
                raise
            return
        self._passed(stored)

    def _run(self, keys: Any, args: Any, client: Any) -> Any:
        """The script itself (a client only when one was given: the wire's script takes none)."""
        if client is None:
            return self.inner(keys=keys, args=args)
        return self.inner(keys=keys, args=args, client=client)

    def __call__(self, keys: Any = (), args: Any = (), client: Any = None) -> Any:
        if self.limiter._asyncio:
            return self._checked_async(keys, args, client)
        if self._due():
            try:
                stored = self._ask()
            except _clients.UNAVAILABLE as err:
                self._unanswered()  # check again later
                if _clients.class_reason(err) == "timeout":
                    raise  # the caller's time is spent: the policy answers, not a second wait
                # else (refused, reset: at once) decide unchecked
            else:
                self._passed(stored)
        return self._run(keys, args, client)

    async def _checked_async(self, keys: Any, args: Any, client: Any) -> Any:
        if self._due():
            try:
                # At most half the limiter's timeout: a hung shard holding the
                # params key leaves the decision the other half.
                stored = await asyncio.wait_for(self._ask(), self.limiter._timeout / 2)
            except asyncio.TimeoutError:
                self._unanswered()
            except _clients.UNAVAILABLE:
                self._unanswered()
            else:
                self._passed(stored)
        return await self._run(keys, args, client)


def guard(limiter: Any) -> None:
    """Check the prefix before the limiter's next decision (its scripts wrapped)."""
    for name in GUARDED:
        script = getattr(limiter, name, None)
        # A script object of redis-py or valkey-py (a stand-in of a test is not checked).
        if hasattr(script, "registered_client") and not isinstance(script, Checked):
            setattr(limiter, name, Checked(limiter, script))


def release(limiter: Any) -> None:
    """The prefix is checked: the limiter's plain scripts again."""
    for name in GUARDED:
        script = getattr(limiter, name, None)
        if isinstance(script, Checked):
            setattr(limiter, name, script.inner)
