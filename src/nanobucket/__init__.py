"""nanobucket: an exact token-bucket rate limiter with a Cython core.

>>> import nanobucket as nb
>>> b = nb.TokenBucket(rate=100, capacity=200)   # bursts of 200, 100/s long-run
>>> b.allow()
True
"""

from ._bucket import IMPLEMENTATION, Decision, KeyedTokenBucket, TokenBucket
from .shared import SharedKeyedTokenBucket

__version__ = "0.1.0"

__all__ = (
    "IMPLEMENTATION",
    "Decision",
    "KeyedTokenBucket",
    "SharedKeyedTokenBucket",
    "TokenBucket",
    "__version__",
)
