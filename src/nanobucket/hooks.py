"""Hooks: a function the integrations call with each decision (`LimitEvent`).

The middlewares (`nanobucket.asgi`, `nanobucket.wsgi`), the FastAPI
dependency and `nanobucket.limit` take ``on_decision=`` (every decision) and
``on_limited=`` (only the refused ones, shadow-limited included). A hook
takes one `LimitEvent`; its return value is ignored. With no hook the
request path pays one ``is None`` test.

A hook runs on the request's path, before the response: keep it fast
(count, log, put on a queue). The asyncio integrations (ASGI, FastAPI, an
``async def`` decorated function) await an ``async def`` hook; the others
take plain functions only. A hook that raises is logged (logger
``"nanobucket"``) and the request goes on as decided: a broken metrics
pipeline never turns into failed requests, nor into a lost decision.

>>> import nanobucket as nb
>>> seen = []
>>> @nb.limit(nb.TokenBucket(rate=1, capacity=1, clock=lambda: 0), on_decision=seen.append)
... def ping() -> str:
...     return "pong"
>>> ping()
'pong'
>>> seen[0].outcome, seen[0].cost, seen[0].decision.remaining
('admitted', 1, 0)
"""

from ._compose.hooks import (
    LimitEvent,
)

__all__ = ["LimitEvent"]
