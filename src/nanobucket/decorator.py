"""``@limit(...)``: rate-limit a function, sync or async, by raising or by waiting.

>>> from nanobucket import TokenBucket
>>> @limit(TokenBucket(rate=1, capacity=1))
... def ping() -> str:
...     return "pong"
>>> ping()
'pong'
>>> try:
...     ping()
... except RateLimited as e:
...     print(f"retry after {e.retry_after:.1f} s")
retry after 1.0 s
"""

from ._compose.decorator import (
    RateLimited,
    limit,
)

__all__ = ["RateLimited", "limit"]
