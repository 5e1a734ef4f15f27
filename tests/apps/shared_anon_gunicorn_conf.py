"""gunicorn config for the anonymous shared table (the README's recipe).

The master creates the table; every worker it forks inherits it.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any

from nanobucket.shared import SharedKeyedTokenBucket

workers = 4
worker_class = "sync"


def on_starting(server: Any) -> None:
    # In the master, before any worker forks; nothing is ever put in /dev/shm.
    # One token an hour, 50 in the bucket, as in shared_gunicorn_conf. The
    # arbiter outlives a reload (HUP), so the table stays with it.
    server.limits = SharedKeyedTokenBucket.create_anonymous(
        rate=Fraction(1, 3600), capacity=50, max_keys=1000
    )


def post_fork(server: Any, worker: Any) -> None:
    import shared_wsgi_app

    shared_wsgi_app.limits = server.limits
