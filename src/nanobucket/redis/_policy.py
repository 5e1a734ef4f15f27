"""The failure policy: who decides, and why, when Redis cannot.

``on_error="local"`` (the default) lets a table of the limiter's own limit in
this process decide, ``"open"`` admits, ``"closed"`` rejects, ``"raise"``
raises :class:`RedisUnavailable`; a ``fallback`` limiter decides instead
when given. Every :class:`RedisDecision` says who decided (``source``) and
why Redis did not (``reason``, from :func:`failure_reason`). An outage is
told once, and what a fallback admitted through it is charged to Redis
after (`_outage`).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable
from typing import TYPE_CHECKING, Any, Literal, Protocol

from redis.exceptions import ConnectionError as RedisConnectionError

from .._core import _bucket
from . import _clients
from ._breaker import CircuitBreaker
from ._outage import Outages

__all__ = ("Fallback", "RedisDecision", "RedisUnavailable", "failure_reason")

Policy = Literal["local", "open", "closed", "raise"]
#: What the warning of an outage says decides meanwhile, by policy (and with a fallback).
_ANSWERS = {
    "local": "each process applies the limit by itself (N processes: up to N times the limit)",
    "fallback": "the fallback limiter decides in each process",
    "open": "every request is admitted (on_error='open')",
    "closed": "every request is refused (on_error='closed')",
}
Source = Literal["redis", "lease", "policy:open", "policy:closed", "fallback"]


if TYPE_CHECKING:
    from .._core._bucket_py import Decision as _Decision
    from .._core._params import Clock
else:
    _Decision = _bucket.Decision  # the selected one: `nanobucket.Decision`


class RedisUnavailable(RedisConnectionError):
    """Redis could not decide (``on_error="raise"``, or ``tokens``): down, timed out, an error
    reply, breaker open.

    The redis-py error, when there was one, is the ``__cause__``.

    A ``redis.ConnectionError``, so code catching redis-py's errors catches it too.

    >>> try:
    ...     RedisTokenBucket(redis.Redis(), 100, 200, on_error="raise", breaker=down).check("a")
    ... except redis.ConnectionError as e:
    ...     print(type(e).__name__, "-", e)
    RedisUnavailable - Redis unavailable: circuit breaker open
    """


# Named where users import it from, as tracebacks print it.
RedisUnavailable.__module__ = "nanobucket.redis"


class RedisDecision(_Decision):
    """A :class:`nanobucket.Decision` plus ``source`` (who decided) and ``reason`` (why).

    ``source`` is ``"redis"`` (the shared bucket), ``"lease"`` (a local lease,
    :class:`LeasedTokenBucket`), ``"fallback"`` (the local fallback limiter
    while Redis could not decide), ``"policy:open"`` or ``"policy:closed"``.
    ``reason`` is None when Redis or a lease decided, else why Redis did not:
    ``"breaker-open"`` (no call made), ``"timeout"``, ``"connection"``
    (refused, reset, too many connections), ``"loading"``, or the lowercased
    code of Redis's error reply: ``"oom"``, ``"readonly"``, ``"busy"``,
    ``"masterdown"``, ``"clusterdown"``, ``"tryagain"``, ``"moved"``,
    ``"ask"``, ``"noperm"``, ``"err"``...; ``"error"`` for anything else.
    Equality compares the five Decision fields only, so a Redis decision
    equals the in-process one for the same trace.

    >>> d = RedisDecision(True, 199, 0, 10_000_000, 200)   # Redis's answer to a first request
    >>> d.source, d.reason, d == KeyedTokenBucket(rate=100, capacity=200).check_at("alice", 0)
    ('redis', None, True)
    """

    __slots__ = ("reason", "source")

    source: Source
    reason: str | None

    def __init__(
        self,
        allowed: bool,
        remaining: int,
        retry_after_ns: int,
        reset_after_ns: int,
        limit: int,
        source: Source = "redis",
        reason: str | None = None,
    ) -> None:
        super().__init__(allowed, remaining, retry_after_ns, reset_after_ns, limit)
        self.source = source
        self.reason = reason

    def __repr__(self) -> str:
        tail = "" if self.reason is None else f", reason={self.reason!r}"
        return f"{super().__repr__()[:-1]}, source={self.source!r}{tail})"


def failure_reason(err: BaseException | None) -> str:
    """Why Redis did not decide, as :attr:`RedisDecision.reason` names it.

    >>> from redis.exceptions import OutOfMemoryError, ResponseError, TimeoutError
    >>> failure_reason(None), failure_reason(TimeoutError("Timeout reading"))
    ('breaker-open', 'timeout')
    >>> failure_reason(OutOfMemoryError("command not allowed", status_code="OOM"))
    'oom'
    >>> failure_reason(ResponseError("BUSY Redis is busy running a script."))
    'busy'
    """
    if err is None:
        return "breaker-open"
    reason = _clients.class_reason(err)  # redis-py's or valkey-py's class
    if reason is not None:
        return reason
    code = getattr(err, "status_code", None)
    if not code and err.args and isinstance(err.args[0], str):
        code = err.args[0].split(" ", 1)[0]
    if isinstance(code, str) and code.isalpha() and code.isupper():
        return code.lower()
    return "error"


#: The most keys a limiter with a fallback remembers as last seen (least recent
#: forgotten first), and the most keys one outage resumes.
_MAX_SEEN = 1 << 17
#: The most keys the local table of ``on_error="local"`` holds through an outage.
LOCAL_MAX_KEYS = 100_000


class Fallback(Protocol):
    """A local keyed limiter to decide while Redis is unreachable."""

    def check(self, key: Hashable, cost: int = 1) -> Any: ...
    def check_at(self, key: Hashable, now: int, cost: int = 1) -> Any: ...
    def peek(self, key: Hashable, cost: int = 1) -> Any: ...
    def peek_at(self, key: Hashable, now: int, cost: int = 1) -> Any: ...
    def allow_many(self, keys: Iterable[Hashable], cost: int = 1) -> bytearray: ...
    def allow_many_at(self, keys: Iterable[Hashable], now: int, cost: int = 1) -> bytearray: ...


class _FailurePolicy:
    """The answers of a limiter whose Redis could not decide (or was not asked)."""

    _rate: Any
    _capacity: int
    _interval_ns: int
    _tau_ns: int
    _none_key: bool
    #: The table deciding under ``on_error="local"`` without a fallback given.
    _local: Any = None

    def __init__(
        self,
        on_error: Policy,
        fallback: Fallback | None,
        breaker: CircuitBreaker | None,
        clock: Clock | None = None,
    ):
        if on_error not in ("local", "open", "closed", "raise"):
            raise ValueError(
                f"on_error must be 'local', 'open', 'closed' or 'raise', got {on_error!r}"
            )
        self._on_error = on_error
        if fallback is None and on_error == "local":
            # The limit itself, in this process: N processes admit at most N times it.
            # One per process by design (a limiter made before a fork warns of nothing).
            fallback = self._local = _bucket.KeyedTokenBucket(
                self._rate,
                self._capacity,
                max_keys=LOCAL_MAX_KEYS,
                none_key=self._none_key,
                per_process=True,
            )
        self._fallback = fallback
        self._answers = _ANSWERS.get(  # "raise" tells nothing: it raises
            on_error if fallback is None else "local" if self._local is not None else "fallback",
            "",
        )
        if breaker is not None and not isinstance(breaker, CircuitBreaker):
            raise TypeError("breaker must be a CircuitBreaker")
        # The failure paths (back-off, probes, what was seen before an outage) read
        # the breaker's clock: the limiter's own clock= unless a breaker is given.
        self._breaker = breaker if breaker is not None else CircuitBreaker(clock=clock)
        # With a fallback: each key's last Redis decision in this process, as the ns
        # when its Redis bucket is full, on the clock of the call (the breaker's clock;
        # `_seen_at`: the explicit times of the `*_at` verbs), most recent last; and
        # the keys the fallback has decided since Redis last answered (see `_resume`).
        self._seen: dict[Hashable, int] = {}
        self._seen_at: dict[Hashable, int] = {}
        self._outages: dict[int, tuple[int, set[Hashable]]] = {}
        self._outage = Outages()  # told once; what the fallback admitted, charged after

    def _breaker_of(self, key: Hashable) -> CircuitBreaker:
        """The breaker that decides for *key* (a cluster's node's: see `_RedisLimits`)."""
        return self._breaker

    def _resume(
        self, fb: Fallback, breaker: CircuitBreaker, key: Hashable, now_ns: int | None
    ) -> None:
        """The first time the fallback decides *key* in an outage (of *breaker*: a cluster
        node's), it starts from what this process last saw of the key's Redis bucket,
        scaled to the fallback's capacity (a key not seen here on the call's clock: the
        fallback's bucket as it is). A full fallback would admit its burst
        again on top of a burst Redis admitted just before the outage."""
        outage, keys = self._outages.get(id(breaker), (-1, set()))
        if outage != breaker.recoveries:
            keys = set()
            self._outages[id(breaker)] = (breaker.recoveries, keys)
        if key in keys or len(keys) >= _MAX_SEEN:
            return
        keys.add(key)
        if now_ns is None:
            full_at, now = self._seen.get(key), self._breaker.clock()
        else:
            full_at, now = self._seen_at.get(key), now_ns
        if full_at is None:
            return
        owed = max(full_at - now, 0) / self._interval_ns  # tokens
        capacity = self._capacity
        share = getattr(fb, "capacity", capacity)
        if not isinstance(share, int):
            share = capacity
        target = math.floor(max(capacity - owed, 0) * share / capacity)
        d = fb.peek(key, 0) if now_ns is None else fb.peek_at(key, now_ns, 0)
        if d.remaining > target:
            spend = d.remaining - target
            _ = fb.check(key, spend) if now_ns is None else fb.check_at(key, now_ns, spend)

    def _policy(
        self, key: Hashable, cost: int, now_ns: int | None, consume: bool, err: BaseException | None
    ) -> RedisDecision:
        if self._fallback is None and self._on_error == "raise":
            raise RedisUnavailable(f"Redis unavailable: {err or 'circuit breaker open'}") from err
        breaker = self._breaker_of(key)  # an outage is its breaker's (a cluster node's)
        reason = failure_reason(err)
        self._outage.tell(breaker, self, reason, self._answers)
        fb = self._fallback
        if fb is not None:
            self._resume(fb, breaker, key, now_ns)
            if consume:
                d = fb.check(key, cost) if now_ns is None else fb.check_at(key, now_ns, cost)
                if d.allowed and cost:
                    self._outage.note(breaker, key, cost, now_ns)
            else:
                d = fb.peek(key, cost) if now_ns is None else fb.peek_at(key, now_ns, cost)
            return RedisDecision(
                d.allowed,
                d.remaining,
                d.retry_after_ns,
                d.reset_after_ns,
                d.limit,
                "fallback",
                reason,
            )
        if self._on_error == "open":
            return RedisDecision(
                True, self._capacity - cost, 0, 0, self._capacity, "policy:open", reason
            )
        # Closed: come back when the breaker will try Redis again (at least one
        # token's interval, so clients never spin on a zero Retry-After).
        retry = max(breaker.retry_in_ns(), cost * self._interval_ns, 1)
        return RedisDecision(False, 0, retry, self._tau_ns, self._capacity, "policy:closed", reason)

    def _policy_many(
        self, keys: list[Hashable], cost: int, now_ns: int | None, err: BaseException | None
    ) -> bytearray:
        fb = self._fallback
        if fb is None and self._on_error == "raise":
            raise RedisUnavailable(f"Redis unavailable: {err or 'circuit breaker open'}") from err
        breakers = [self._breaker_of(key) for key in keys]
        self._outage.tell(breakers[0], self, failure_reason(err), self._answers)
        if fb is None:
            return bytearray([1 if self._on_error == "open" else 0]) * len(keys)
        for breaker, key in zip(breakers, keys):
            self._resume(fb, breaker, key, now_ns)
        admitted = (
            fb.allow_many(keys, cost) if now_ns is None else fb.allow_many_at(keys, now_ns, cost)
        )
        if cost:
            for breaker, key, allowed in zip(breakers, keys, admitted):
                if allowed:
                    self._outage.note(breaker, key, cost, now_ns)
        return admitted

    def _reserve_policy(self, key: Hashable, cost: int, now_ns: int | None, err: Any) -> int:
        """What `reserve` answers when Redis cannot: admitted now (0) or refused (-1)."""
        return 0 if self._policy(key, cost, now_ns, True, err).allowed else -1

    def _lost(self, verb: str, key: Hashable, args: tuple[Any, ...], err: Any) -> bool:
        """A refund or reset Redis could not take: to the fallback if it has *verb*, else lost.

        Never queued: a refund is worth only its moment, and a bucket that
        keeps the tokens refills them by itself. Raises only under
        ``on_error="raise"`` without a fallback, as every verb does.
        """
        fb = self._fallback
        if fb is not None:
            fn = getattr(fb, verb, None)
            if fn is not None:
                fn(key, *args)
            return False
        if self._on_error == "raise":
            raise RedisUnavailable(f"Redis unavailable: {err or 'circuit breaker open'}") from err
        return False

    def _policy_answer(
        self, key: Hashable, cost: int, now_ns: int | None, consume: bool, err: BaseException | None
    ) -> Any:
        """`_policy`, its exception returned, not raised (each coalesced caller gets its own)."""
        try:
            return self._policy(key, cost, now_ns, consume, err)
        except RedisUnavailable as exc:
            return exc
