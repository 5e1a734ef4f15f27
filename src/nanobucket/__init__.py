"""nanobucket: an exact token-bucket rate limiter with a Cython core.

>>> import nanobucket as nb
>>> b = nb.TokenBucket(rate=100, capacity=200)   # bursts of 200, 100/s long-run
>>> b.allow()
True
"""

from ._core._bucket import IMPLEMENTATION, Decision, KeyedTokenBucket, TokenBucket
from ._core._limiter import (
    Clocked,
    Composite,
    KeyedLimiter,
    Limiter,
    Refundable,
    Reservable,
    Reservation,
)
from .concurrency import Concurrency, KeyedConcurrency
from .decorator import RateLimited, limit
from .executor import LimitedExecutor
from .hooks import LimitEvent
from .layered import AllOf, LayeredDecision, all_of
from .one_key import OneKey
from .pacing import paced, paced_gather
from .penalty import AsyncPenaltyBox, Banned, PenaltyBox, penalty_box
from .shared import SharedKeyedTokenBucket
from .tiered import AsyncTiered, Tiered, TieredDecision, tiered
from .waiting import LeakyBucket, Waiting

__version__ = "0.1.0"

__all__ = (
    "IMPLEMENTATION",
    "AllOf",
    "AsyncPenaltyBox",
    "AsyncTiered",
    "Banned",
    "Clocked",
    "Composite",
    "Concurrency",
    "Decision",
    "KeyedConcurrency",
    "KeyedLimiter",
    "KeyedTokenBucket",
    "LayeredDecision",
    "LeakyBucket",
    "LimitEvent",
    "LimitedExecutor",
    "Limiter",
    "OneKey",
    "PenaltyBox",
    "RateLimited",
    "Refundable",
    "Reservable",
    "Reservation",
    "SharedKeyedTokenBucket",
    "Tiered",
    "TieredDecision",
    "TokenBucket",
    "Waiting",
    "__version__",
    "all_of",
    "limit",
    "paced",
    "paced_gather",
    "penalty_box",
    "tiered",
)
