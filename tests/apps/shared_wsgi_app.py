"""A tiny WSGI app for the gunicorn tests: every worker asks one shared table.

``post_fork`` hands each worker the table: the anonymous one the master
made in ``on_starting`` and the worker inherited (``shared_anon_gunicorn_conf``)
or a named one, opened by path (``shared_gunicorn_conf``). ``table()`` also
opens a named one lazily, so the app works with ``preload_app`` too.
"""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterable

from nanobucket.shared import SharedKeyedTokenBucket

limits: SharedKeyedTokenBucket | None = None  # set by post_fork in each worker


def table() -> SharedKeyedTokenBucket:
    global limits
    if limits is None:
        limits = SharedKeyedTokenBucket.open(path=os.environ["NB_SHARED_TABLE"])
    return limits


def app(
    environ: dict[str, object], start_response: Callable[[str, list[tuple[str, str]]], object]
) -> Iterable[bytes]:
    """``GET /<key>``: 200 if *key*'s bucket admits the request, else 429 with Retry-After."""
    key = str(environ.get("PATH_INFO", "/")).strip("/")
    kind = "anonymous" if table().path is None else "named"
    headers = [("Content-Type", "text/plain"), ("X-Worker", str(os.getpid())), ("X-Table", kind)]
    if key == "_health":
        start_response("200 OK", headers)
        return [b"up\n"]
    time.sleep(0.005)  # hold the worker a moment, so concurrent clients spread over workers
    d = table().check(key)
    headers.append(("RateLimit-Remaining", str(d.remaining)))
    if d.allowed:
        start_response("200 OK", headers)
        return [b"ok\n"]
    headers.append(("Retry-After", str(math.ceil(d.retry_after_ns / 1e9))))
    start_response("429 Too Many Requests", headers)
    return [b"slow down\n"]
