"""A Flask app behind the WSGI middleware, for the real-gunicorn tests.

``NB_RATE`` and ``NB_CAPACITY`` configure an in-process `KeyedTokenBucket`;
when ``NB_SHARED_PATH`` is set, every worker instead opens the shared-memory
table that `gunicorn_conf.on_starting` created there, so all workers share
one limit. ``NB_KEY=unix`` keys by the ``X-Forwarded-For`` of the proxy on
a unix socket; ``NB_CAFE_CAPACITY`` gives ``/café`` its own, stricter
in-process limiter. ``/healthz`` is exempt; ``/files/<path:p>`` serves any
path below it, ``/files/../healthz`` included.
"""

from __future__ import annotations

import os
import time
from typing import Any

from flask import Flask

import nanobucket as nb
from nanobucket.wsgi import RateLimitMiddleware, Route, client_address

shared_path = os.environ.get("NB_SHARED_PATH")
if shared_path:
    limiter: object = nb.SharedKeyedTokenBucket.open(path=shared_path)
else:
    limiter = nb.KeyedTokenBucket(
        rate=float(os.environ["NB_RATE"]), capacity=int(os.environ["NB_CAPACITY"])
    )

app = Flask(__name__)


@app.route("/")
@app.route("/café")
def hello() -> str:
    return "hello"


@app.route("/healthz")
def healthz() -> str:
    return "ok"


@app.route("/files/<path:p>")
def files(p: str) -> str:
    return "files:" + p


unix = os.environ.get("NB_KEY") == "unix"
key = client_address(trusted_proxies=["unix:"]) if unix else client_address()
cafe = os.environ.get("NB_CAFE_CAPACITY")
rate = float(os.environ["NB_RATE"])
routes = [Route("/café", nb.KeyedTokenBucket(rate=rate, capacity=int(cafe)))] if cafe else []
app.wsgi_app = RateLimitMiddleware(  # type: ignore[method-assign]
    app.wsgi_app, limiter, key=key, routes=routes, exempt=["/healthz"]
)
limited_app = app.wsgi_app


def busy_worker(environ: dict[str, Any], start_response: Any) -> Any:
    """Outside the limiter: every answer names its worker, and each request
    keeps its worker busy 10 ms, so concurrent clients spread over the workers."""
    time.sleep(0.01)

    def start(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
        return start_response(status, [*headers, ("X-Worker", str(os.getpid()))], exc_info)

    return limited_app(environ, start)


app.wsgi_app = busy_worker  # type: ignore[method-assign]
