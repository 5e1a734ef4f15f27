"""A limiter as the gate uses it (`Policy`), and the header fields of its decisions.

Header conventions (all values in whole seconds, rounded *up* so a client
that waits what it is told is never early):

* ``Retry-After`` (RFC 9110) on a 429: ``ceil(retry_after)``, at least 1.
* ``RateLimit-Policy: "default";q=<quota>;w=<window>`` and
  ``RateLimit: "default";r=<remaining>;t=<reset>`` (IETF httpapi draft).
  A token bucket is mapped to a window ``w`` = the time an empty bucket takes
  to fill (at least 1 s) and a quota ``q = floor(rate * w)``, so ``q / w`` is
  the long-run rate and, when the refill time is whole seconds,
  ``q`` is the capacity; ``t`` is the time until the bucket is full again.
* ``X-RateLimit-Limit`` (capacity), ``X-RateLimit-Remaining`` and
  ``X-RateLimit-Reset`` (seconds until full, a delta, not an epoch): the
  older form, for clients that read only that.

The fields name the policy: ``name=`` (``"default"``) for one limiter. A
limiter made of others (`nanobucket.Composite`: ``all_of``, ``tiered``)
shows one bucket, the one that bound the decision (its ``binding``: the
refusing layer with the longest wait, else the layer with the fewest tokens
left), and every field (``q``, ``w``, ``r``, ``t``, the ``X-RateLimit-*``
ones, ``Retry-After``) is that bucket's, as the decision's own numbers are.
It is named as its limiter names it (a plan, ``"free"``; a layer given
``names=``), else by the policy name and what the bucket is:
``"default:per-key"`` (one bucket per key) or ``"default:shared"`` (one for
every key), numbered in the order of ``leaves()`` when two unnamed buckets
are of one kind (``"default:per-key-1"``, ``"default:per-key-2"``). The 429
body names the same.
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Hashable
from typing import Any

from .._core._limiter import Composite, is_async, is_keyed, traits
from .._core._params import (
    NAME_CHARS,
    NS_PER_S,
    int_at_least,
    rate_fraction,
    validated_cost,
    validated_name,
)

__all__ = (
    "HEADER_MODES",
    "NAME_CHARS",
    "Policy",
    "headers_mode",
    "keyed_of",
    "limit_headers",
    "problem_body",
    "rejection",
    "retry_after_seconds",
)

Headers = list[tuple[bytes, bytes]]
Check = Callable[[Hashable, int], Any]  # -> Decision, or an awaitable of one
# A bucket's fields: its name, the RateLimit field up to "r=", its RateLimit-Policy field.
Fields = tuple[str, bytes, tuple[bytes, bytes] | None]

HEADER_MODES = ("ietf", "legacy", "off")
_NS = NS_PER_S


def keyed_of(limiter: object, keyed: bool | None) -> bool:
    """Whether ``limiter.check`` takes a key first: *keyed* when given, else the
    limiter's own ``keyed`` (see `nanobucket._core._limiter`).

    >>> import nanobucket as nb
    >>> keyed_of(nb.TokenBucket(1, 1), None), keyed_of(nb.TokenBucket(1, 1), True)
    (False, True)
    """
    if not traits(limiter).checks:
        raise TypeError(
            f"limiter must have a check() method (a nanobucket limiter), "
            f"not {type(limiter).__name__}"
        )
    if keyed is not None:
        return keyed
    try:
        return is_keyed(limiter)
    except TypeError as e:
        raise TypeError(f"{e}: give it one, or pass keyed=True/False") from None


def _checker(limiter: Any, keyed: bool) -> Check:
    """``(key, cost) -> Decision`` for any limiter, keyed or not."""
    check = limiter.check
    if keyed:
        return check  # type: ignore[no-any-return]

    def unkeyed(key: Hashable, cost: int) -> Any:
        return check(cost)

    return unkeyed


def retry_after_seconds(retry_after_ns: int) -> int:
    """``Retry-After`` for a limited request: rounded up and never 0.

    >>> retry_after_seconds(0), retry_after_seconds(1_000_000_001)
    (1, 2)
    """
    s = -(-retry_after_ns // _NS)
    return s if s > 0 else 1


def _policy_header(name: str, limiter: object) -> tuple[bytes, bytes] | None:
    """The ``RateLimit-Policy`` field of one bucket (None unless it has a rate and capacity)."""
    capacity = getattr(limiter, "capacity", None)
    rate = getattr(limiter, "rate", None)
    if not isinstance(capacity, int) or rate is None:
        return None
    # w: the time an empty bucket takes to fill, in whole seconds (>=1);
    # q: what the long-run rate admits in w. See the module docstring.
    exact_rate = rate_fraction(rate)  # 0.1 as the decimal 1/10, as the bucket reads it
    window = max(1, math.ceil(capacity / exact_rate))
    quota = max(1, math.floor(exact_rate * window))
    return (b"ratelimit-policy", f'"{name}";q={quota};w={window}'.encode("ascii"))


def _default_names(
    policy: str, leaves: tuple[object, ...], names: tuple[str | None, ...]
) -> dict[int, str]:
    """The names of a composite's unnamed buckets, by id: *policy* and what the bucket
    is (``per-key``: one per key; ``shared``: one for every key), numbered from 1 in
    the order of *leaves* where two are of one kind.

    >>> import nanobucket as nb
    >>> a, b, c = nb.KeyedTokenBucket(1, 1), nb.KeyedTokenBucket(2, 2), nb.TokenBucket(3, 3)
    >>> sorted(_default_names("api", (a, b, c), (None, None, None)).values())
    ['api:per-key-1', 'api:per-key-2', 'api:shared']
    """
    kinds: dict[int, str] = {}
    for leaf, name in zip(leaves, names):
        if name is None and id(leaf) not in kinds:
            kinds[id(leaf)] = "per-key" if getattr(leaf, "keyed", False) is True else "shared"
    made: dict[int, str] = {}
    seen: dict[str, int] = {}
    for leaf_id, kind in kinds.items():
        if list(kinds.values()).count(kind) > 1:
            seen[kind] = seen.get(kind, 0) + 1
            made[leaf_id] = f"{policy}:{kind}-{seen[kind]}"
        else:
            made[leaf_id] = f"{policy}:{kind}"
    return made


def _snapshot(leaves: tuple[object, ...]) -> tuple[tuple[object, object], ...]:
    return tuple((getattr(b, "rate", None), getattr(b, "capacity", None)) for b in leaves)


class Policy:
    """One limiter as the gate uses it: its check function and its header fields.

    One bucket's fields are made once (``policy_header``, ``r_prefix``) and
    again only when it is reconfigured (`stale`, `refresh`). A composite's
    (``all_of``, ``tiered``) are those of the bucket that bound each
    decision, made at its first decision (`fields`) and again when that
    bucket is reconfigured.

    >>> import nanobucket as nb
    >>> Policy(nb.KeyedTokenBucket(rate=100, capacity=200), "default", None).policy_header
    (b'ratelimit-policy', b'"default";q=200;w=2')
    """

    __slots__ = (
        "_by_leaf",
        "_unnamed",
        "capacity",
        "capacity_seen",
        "check",
        "composite",
        "ietf_extra",
        "is_async",
        "keyed",
        "leaves",
        "limiter",
        "name",
        "policy_header",
        "r_prefix",
        "rate_seen",
        "seen",
        "watched",
    )

    def __init__(self, limiter: object, name: str, keyed: bool | None) -> None:
        validated_name(name, "policy name")
        learnt = traits(limiter)
        if learnt.releases:
            raise TypeError(
                "an in-flight limit (Concurrency, or an all_of holding one) keeps its slots "
                "until released, and a decision per request never releases them: hold the "
                "slot around the handler instead (with limiter.slot(key): ...)"
            )
        self.limiter = limiter  # for charge= (refund and debit after the response)
        self.keyed = keyed_of(limiter, keyed)
        self.check = _checker(limiter, self.keyed)
        self.is_async = is_async(limiter)
        self.name = name
        self.capacity: int | None = learnt.capacity
        self.r_prefix = f'"{name}";r='.encode("ascii")  # the RateLimit field up to r=
        # The buckets whose rate and capacity the header fields show: the
        # fields are built once, and again only when one is reconfigured.
        self.composite: Composite | None = None
        # A composite's buckets without a name of their own, by id: the names made for them.
        self._unnamed: dict[int, str] = {}
        if isinstance(limiter, Composite):
            self.composite = limiter
            self.leaves: tuple[object, ...] = tuple(limiter.leaves())
            self._unnamed = _default_names(name, self.leaves, tuple(limiter.leaf_names()))
        elif learnt.bucket:
            self.leaves = (limiter,)
        else:
            self.leaves = ()
        self.refresh()

    def refresh(self) -> None:
        """Build the header fields from the limiter's rate and capacity as they are now."""
        limiter = self.limiter
        self.seen = _snapshot(self.leaves)
        header = None if self.composite is not None else _policy_header(self.name, limiter)
        self.policy_header = header
        # One bucket: the hot path compares its rate (by identity) and capacity inline.
        self.watched: Any = limiter if header is not None else None
        self.rate_seen = getattr(limiter, "rate", None)
        self.capacity_seen = getattr(limiter, "capacity", None)
        # The fields that never change (none for a composite: its binding bucket's do).
        self.ietf_extra: tuple[tuple[bytes, bytes], ...] = (header,) if header is not None else ()
        # A composite's fields by binding bucket, with the rate and capacity they show.
        self._by_leaf: dict[tuple[str | None, int], tuple[Fields, object, object]] = {}

    def stale(self) -> bool:
        """Whether a bucket behind the fields was reconfigured since they were built."""
        w = self.watched
        if w is not None:
            return bool(w.rate is not self.rate_seen or w.capacity != self.capacity_seen)
        return bool(self.leaves) and _snapshot(self.leaves) != self.seen

    def fields(self, decision: Any) -> Fields:
        """The name and fields of the bucket that bound *decision* (of a composite).

        >>> import nanobucket as nb
        >>> limit = nb.all_of(nb.KeyedTokenBucket(1, 2), nb.TokenBucket(10, 5))
        >>> policy = Policy(limit, "default", None)
        >>> policy.fields(limit.check_at("alice", 0, cost=2))[0]   # the client's bucket binds
        'default:per-key'
        >>> policy.fields(limit.check_at("bob", 0)) is policy.fields(limit.check_at("eve", 0))
        True
        """
        assert self.composite is not None
        name, leaf = self.composite.binding(decision)
        slot = (name, id(leaf))  # as binding() said it, so that the next decision finds it
        got = self._by_leaf.get(slot)
        # Only this bucket's fields are sent: only its reconfigure makes them stale.
        if got is None or (
            got[1] is not None and (leaf.rate is not got[1] or leaf.capacity != got[2])
        ):
            if name is None:  # not named by its limiter: the policy's name and its kind
                name = self._unnamed.get(id(leaf), self.name)
            header = _policy_header(name, leaf)
            # The rate (compared by identity) and capacity its RateLimit-Policy shows.
            rate = leaf.rate if header is not None else None
            capacity = getattr(leaf, "capacity", None)
            got = ((name, f'"{name}";r='.encode("ascii"), header), rate, capacity)
            self._by_leaf[slot] = got
        return got[0]

    def validated_cost(self, cost: object) -> int:
        """Check a cost against the limiter now (a fixed one: before the first request).

        >>> import nanobucket as nb
        >>> Policy(nb.TokenBucket(rate=1, capacity=2), "default", None).validated_cost(2)
        2
        """
        if self.capacity is not None:
            return validated_cost(cost, self.capacity)
        return int_at_least(cost, "cost", 0)


def limit_headers(mode: str, policy: Policy, decision: Any) -> Headers:
    """The rate-limit fields for one decision (empty when *mode* is "off").

    >>> import nanobucket as nb
    >>> bucket = nb.TokenBucket(rate=1, capacity=2)
    >>> limit_headers("ietf", Policy(bucket, "default", None), bucket.check_at(0))
    [(b'ratelimit-policy', b'"default";q=2;w=2'), (b'ratelimit', b'"default";r=1;t=1')]
    """
    if mode == "ietf":
        w = policy.watched  # policy.stale(), inlined for the one-bucket case
        if w is not None:
            if w.rate is not policy.rate_seen or w.capacity != policy.capacity_seen:
                policy.refresh()
        elif policy.composite is None and policy.leaves and policy.stale():
            policy.refresh()  # (a composite's fields are checked with its binding bucket's)
        reset = -(-decision.reset_after_ns // _NS)
        if policy.composite is None:
            value = b"%b%d;t=%d" % (policy.r_prefix, decision.remaining, reset)
            return [*policy.ietf_extra, (b"ratelimit", value)]
        _, r_prefix, header = policy.fields(decision)
        value = b"%b%d;t=%d" % (r_prefix, decision.remaining, reset)
        if header is None:
            return [(b"ratelimit", value)]
        return [header, (b"ratelimit", value)]
    if mode == "legacy":
        return [
            (b"x-ratelimit-limit", b"%d" % decision.limit),
            (b"x-ratelimit-remaining", b"%d" % decision.remaining),
            (b"x-ratelimit-reset", b"%d" % -(-decision.reset_after_ns // _NS)),
        ]
    return []


@functools.lru_cache(maxsize=1024)
def problem_body(retry_after: int, name: str) -> bytes:
    """A small RFC 9457 ``application/problem+json`` body for a 429.

    Cached: a flood of rejected requests repeats a few bodies, and a 429
    should cost less than the request it turns away.

    >>> problem_body(2, "default")[:40]
    b'{"type":"about:blank","title":"Too Many '
    """
    return json.dumps(
        {
            "type": "about:blank",
            "title": "Too Many Requests",
            "status": 429,
            "detail": f"Rate limit {name!r} exceeded; retry after {retry_after} s.",
            "retry_after": retry_after,
        },
        separators=(",", ":"),
    ).encode("utf-8")


def rejection(mode: str, policy: Policy, decision: Any) -> tuple[Headers, bytes]:
    """Headers and body of the 429 answer.

    >>> import nanobucket as nb
    >>> bucket = nb.TokenBucket(rate=1, capacity=1)
    >>> bucket.allow_at(0)
    True
    >>> rejection("off", Policy(bucket, "default", None), bucket.check_at(0))[0][2]
    (b'retry-after', b'1')
    """
    seconds = retry_after_seconds(decision.retry_after_ns)
    # A composite names the bucket that refused, as its header fields do.
    name = policy.name if policy.composite is None else policy.fields(decision)[0]
    body = problem_body(seconds, name)
    headers = [
        (b"content-type", b"application/problem+json"),
        (b"content-length", b"%d" % len(body)),
        (b"retry-after", b"%d" % seconds),
    ]
    headers.extend(limit_headers(mode, policy, decision))
    return headers, body


def headers_mode(mode: object) -> str:
    """Validate ``headers=``: "ietf" (default), "legacy" or "off".

    >>> headers_mode("legacy")
    'legacy'
    """
    if mode not in HEADER_MODES:
        raise ValueError(f"headers must be one of {HEADER_MODES}, got {mode!r}")
    return mode
