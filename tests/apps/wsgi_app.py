"""A Flask app behind the WSGI middleware, for the real-gunicorn tests.

``NB_RATE`` and ``NB_CAPACITY`` configure an in-process `KeyedTokenBucket`;
when ``NB_SHARED_PATH`` is set, every worker instead opens the shared-memory
table that `gunicorn_conf.on_starting` created there, so all workers share
one limit.
"""

from __future__ import annotations

import os

from flask import Flask

import nanobucket as nb
from nanobucket.wsgi import RateLimitMiddleware

shared_path = os.environ.get("NB_SHARED_PATH")
if shared_path:
    limiter: object = nb.SharedKeyedTokenBucket.open(path=shared_path)  # type: ignore[attr-defined]
else:
    limiter = nb.KeyedTokenBucket(
        rate=float(os.environ["NB_RATE"]), capacity=int(os.environ["NB_CAPACITY"])
    )

app = Flask(__name__)


@app.route("/")
def hello() -> tuple[str, int, dict[str, str]]:
    return "hello", 200, {"X-Worker": str(os.getpid())}


app.wsgi_app = RateLimitMiddleware(app.wsgi_app, limiter)  # type: ignore[method-assign]
