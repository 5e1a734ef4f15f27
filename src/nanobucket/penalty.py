"""A penalty box: a key refused too often is refused outright for a while, as fail2ban bans.

``penalty_box(limiter, strikes=5, within=60, ban=900)`` wraps a keyed
limiter (a login endpoint's, say)::

    login = penalty_box(KeyedTokenBucket(rate=1, capacity=5), strikes=5, within=60, ban=900)
    login.allow(client_ip)      # the limiter's decision, unless the key is banned

Every refusal of the limiter is a strike against its key. A key refused
``strikes`` times in less than ``within`` seconds is banned for ``ban``
seconds: each of its requests is then refused without reaching the limiter
(its tokens stay as they are), with ``retry_after`` the time left of the
ban, to the nanosecond. The refusal that starts a ban is already answered
as a ban.

**Strikes are forgiven one per ``within`` seconds**, as tokens refill: the
strikes are a token bucket of ``strikes`` tokens refilling one per
``within``, and the ban a bucket of one token refilling one per ``ban``,
both tables of the limiter's own kind. So ``strikes`` refusals closer
together than ``within`` always ban the key; refusals at most one per
``within`` never do; and a key refused more often than that is banned once
its refusals outrun the forgiving by ``strikes`` (fail2ban counts only the
last ``within`` seconds: 6 refusals 20 s apart ban here with ``strikes=5,
within=60``, but no minute holds more than 3 of them). A ban shorter than
``strikes * within`` leaves strikes unforgiven: a key refused again soon
after its ban is banned again sooner (as fail2ban's "recidive" jail does).

**An admitted request does not clear strikes** (fail2ban forgets none on
success either): a client guessing passwords between refusals gains
nothing. `unban` clears a key's ban and strikes (a support desk letting a
user back in).

The kind of table follows the limiter: a `KeyedTokenBucket` gets in-process
tables on its clock; a `SharedKeyedTokenBucket` shared tables (anonymous if
it is, else files beside it named ``<its path>-strikes`` and ``-bans``), so
that every worker sees one ban (they read the monotonic clock: a table made
with ``clock=`` takes explicit times, the ``_at`` verbs); a ``RedisTokenBucket`` or
``AsyncRedisTokenBucket`` tables on its Redis under ``prefix`` (their
``on_error="open"``: an outage bans no one, and the limiter's own policy
still decides). Any other keyed limiter takes tables given to `PenaltyBox`.

It is a keyed limiter: ``allow``, ``check``, ``peek``, ``tokens``,
``allow_many``, ``refund`` (the limiter's; strikes stay) and their ``_at``
forms, so it goes wherever its limiter goes (``all_of``, ``@limit``, the
middlewares, the FastAPI dependency); its ``rate`` and ``capacity`` are the
limiter's, and so are its header fields. A ban's decision is a `Banned`
(``allowed=False, remaining=0``, ``retry_after`` and ``reset_after`` the ban
left). ``peek`` spends no strike, and does not foresee the ban a ``check``
would start.

Bounds and races. Each request of a key not banned costs one more lookup
(a ``peek`` of its ban: on Redis one more round trip), a refused one two
more, and the one that starts a ban three. The tables hold as many keys as
the limiter's (``max_keys``): past it an in-process table forgives the
bans nearest their end first, and a shared table admits (a new key's ban
is not kept: the tables fail open, so a flood of keys can never ban anyone
else). A request decided while another starts its key's ban may still
reach the limiter once.
"""

from __future__ import annotations

import math
import sys
from fractions import Fraction
from typing import Any

from ._compose.penalty import AsyncPenaltyBox, Banned, PenaltyBox, _check_limiter
from ._core import _bucket_py
from ._core._bucket import KeyedTokenBucket
from ._core._limiter import is_async
from ._core._params import NS_PER_S, int_at_least, real_seconds
from .shared import SharedKeyedTokenBucket

__all__ = ("AsyncPenaltyBox", "Banned", "PenaltyBox", "penalty_box")

DEFAULT_PREFIX = "nanobucket-penalty"


def _ns(seconds: object, name: str) -> int:
    """*seconds* (an int or float > 0) as whole ns, rounded up."""
    value = real_seconds(seconds, name)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{name} must be a finite number of seconds, got {seconds!r}")
    # A float as the decimal written (0.1 s is 100 ms), an int exactly.
    exact = Fraction(value) if isinstance(value, int) else Fraction(float.__repr__(float(value)))
    if exact <= 0:
        raise ValueError(f"{name} must be > 0 seconds, got {seconds!r}")
    return -(-exact.numerator * NS_PER_S // exact.denominator)


def _tables_like(
    limiter: Any, limits: tuple[tuple[Fraction, int], ...], prefix: str | None
) -> list[Any]:
    """A table per ``(rate, capacity)`` of *limits*, of *limiter*'s kind (see the module)."""
    redis = sys.modules.get("nanobucket.redis")  # imported if the limiter is one of its
    if redis is not None and isinstance(
        limiter, (redis.RedisTokenBucket, redis.AsyncRedisTokenBucket)
    ):
        base = DEFAULT_PREFIX if prefix is None else prefix
        return [
            type(limiter)(
                limiter.client,
                rate,
                capacity,
                prefix=f"{base}:{part}",
                timeout=limiter.timeout,
                on_error="open",
                none_key=limiter.none_key,
            )
            for (rate, capacity), part in zip(limits, ("strikes", "bans"))
        ]
    if prefix is not None:
        raise TypeError("prefix= names the tables in Redis: give it with a Redis limiter only")
    if isinstance(limiter, SharedKeyedTokenBucket):
        path = limiter.path
        opts: dict[str, Any] = {
            "max_keys": limiter.max_keys,
            "when_full": "admit",  # fail open: a flood of keys never bans one
            "none_key": limiter.none_key,
        }
        if path is None:
            return [
                SharedKeyedTokenBucket.create_anonymous(rate=rate, capacity=capacity, **opts)
                for rate, capacity in limits
            ]
        return [
            SharedKeyedTokenBucket.open_or_create(
                path=f"{path}-{part}", rate=rate, capacity=capacity, **opts
            )
            for (rate, capacity), part in zip(limits, ("strikes", "bans"))
        ]
    if isinstance(limiter, (KeyedTokenBucket, _bucket_py.KeyedTokenBucket)):
        return [
            type(limiter)(
                rate,
                capacity,
                max_keys=limiter.max_keys,
                clock=limiter.clock_ns,
                none_key=limiter.none_key,
                per_process=limiter.per_process,  # a copy in a forked child: as the limiter
            )
            for rate, capacity in limits
        ]
    raise TypeError(
        f"penalty_box() makes its tables for a KeyedTokenBucket, SharedKeyedTokenBucket, "
        f"RedisTokenBucket or AsyncRedisTokenBucket, not {type(limiter).__name__}: "
        "give PenaltyBox(limiter, strikes=..., bans=...) tables of its kind"
    )


def penalty_box(
    limiter: Any,
    *,
    strikes: int = 5,
    within: float = 60,
    ban: float = 900,
    prefix: str | None = None,
) -> Any:  # a PenaltyBox or an AsyncPenaltyBox: which one depends on the limiter
    """*limiter*, banning for *ban* seconds a key refused *strikes* times within *within* s.

    Strikes are forgiven one per *within* seconds (see the module). The
    tables are of *limiter*'s kind; *prefix* (Redis only, default
    ``"nanobucket-penalty"``) is where they live in Redis: give each penalty
    box on one Redis its own. A `PenaltyBox`, or an `AsyncPenaltyBox` for an
    asyncio limiter.

    >>> from nanobucket import KeyedTokenBucket
    >>> login = penalty_box(KeyedTokenBucket(rate=1, capacity=3), strikes=2, within=60, ban=900)
    >>> [login.allow_at("mallory", 0) for _ in range(6)]
    [True, True, True, False, False, False]
    >>> login.check_at("mallory", 899 * 10**9).retry_after, login.allow_at("mallory", 900 * 10**9)
    (1.0, True)
    """
    count = int_at_least(strikes, "strikes", 1)
    limits = (
        (Fraction(NS_PER_S, _ns(within, "within")), count),
        (Fraction(NS_PER_S, _ns(ban, "ban")), 1),
    )
    # The limiter is checked before any table is made (a shared one is a file).
    _check_limiter(limiter)
    made = _tables_like(limiter, limits, prefix)
    box = AsyncPenaltyBox if is_async(limiter) else PenaltyBox
    return box(limiter, strikes=made[0], bans=made[1])
