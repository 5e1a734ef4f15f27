"""gunicorn config for the shared-table test: the master creates, workers open."""

from __future__ import annotations

import os
from fractions import Fraction
from typing import Any

from nanobucket.shared import SharedKeyedTokenBucket

workers = 4
worker_class = "sync"


def on_starting(server: Any) -> None:
    # One token an hour, 50 in the bucket: nothing refills during the test,
    # so exactly 50 requests per key are admitted, whichever worker serves them.
    SharedKeyedTokenBucket.create(
        path=os.environ["NB_SHARED_TABLE"], rate=Fraction(1, 3600), capacity=50, max_keys=1000
    ).close()


def post_fork(server: Any, worker: Any) -> None:
    import shared_wsgi_app

    shared_wsgi_app.limits = SharedKeyedTokenBucket.open(path=os.environ["NB_SHARED_TABLE"])


def on_exit(server: Any) -> None:
    os.unlink(os.environ["NB_SHARED_TABLE"])
