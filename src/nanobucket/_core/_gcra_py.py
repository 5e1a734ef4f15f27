"""The GCRA rule in Python: the pure-Python twin's one step, as `_gcra.pxd` is the Cython core's.

Each bucket is one int, ``tat`` (ns): it holds ``capacity - max(0, tat - now)
/ interval`` tokens. A step spends ``cost_t`` ns of it when the result stays
within ``slack`` of now; every verb of `_bucket_py` is one of these four.
"""

from __future__ import annotations

__all__ = ("INT64_MAX", "carry_over", "give_back", "reserve", "step")

INT64_MAX = (1 << 63) - 1


def step(tat: int, now: int, cost_t: int, slack: int) -> int:
    """The decision on *tat*: the tat after it (>= 0), or < 0 if the request is rejected.

    Admitted: ``max(tat, now) + cost_t``, or *tat* itself for cost 0 (a
    probe). Rejected: minus the ns until the same request would fit (its
    ``retry_after_ns``); the bucket keeps *tat*.
    """
    base = tat if tat > now else now
    if base - now > slack:
        return slack - (base - now)
    return base + cost_t if cost_t else tat


def reserve(tat: int, now: int, cost_t: int, slack: int, max_wait: int) -> tuple[int, int]:
    """Go past empty if need be: ``(ns to wait, tat after)``; ``(-1, tat)``: nothing reserved.

    The wait ends when max(tat, now) + cost*T - now <= slack: slack = tau
    waits for the tokens, slack = cost*T for the slot's start (shaping).
    """
    base = tat if tat > now else now
    wait = max(base - now - (slack - cost_t), 0)
    if wait > max_wait or base > INT64_MAX - cost_t:
        return -1, tat
    return wait, base + cost_t if cost_t else tat


def give_back(tat: int, now: int, cost_t: int) -> int:
    """The tat after giving *cost_t* back: max(now, tat - cost_t); a full bucket keeps its tat."""
    if tat <= now:
        return tat
    tat -= cost_t
    return tat if tat > now else now


def carry_over(tat: int, now: int, interval: int, tau: int, new_interval: int, new_tau: int) -> int:
    """*tat* re-expressed under new parameters, keeping the tokens as they are at *now*.

    Tokens ``(tau - debt) / interval`` (negative while waiters hold
    reservations past an empty bucket) carry over unchanged, capped at the
    new capacity; the new debt is rounded up, so the bucket never gains a
    fraction of a token from the conversion.
    """
    debt = tat - now if tat > now else 0
    new_debt = new_tau - ((tau - debt) * new_interval) // interval
    if new_debt <= 0:
        return tat if tat <= now else now  # full (capped): keep a full state as it was
    return min(now + new_debt, INT64_MAX)
