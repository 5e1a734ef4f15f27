"""A Celery app for the real-worker test: a task limited by a RedisTokenBucket shared by
every worker (rate 2/s, capacity 3), on the Redis broker at ``$NANOBUCKET_CELERY_URL``.

Each run of the task body and each refusal (with its countdown) is recorded in Redis
lists, so the test reads what the worker did.
"""

from __future__ import annotations

import json
import os
from typing import Any

import redis
from celery import Celery, Task, signals

from nanobucket.celery import RateLimitedTask
from nanobucket.redis import RedisTokenBucket

URL = os.environ["NANOBUCKET_CELERY_URL"]
PREFIX = os.environ.get("NANOBUCKET_CELERY_PREFIX", "nb-celery")

app = Celery("celery_app", broker=URL)
app.conf.update(
    broker_connection_retry_on_startup=True,
    task_default_queue=PREFIX,
    worker_hijack_root_logger=False,
    task_ignore_result=True,
)
shared = RedisTokenBucket.from_url(URL, rate=2, capacity=3, prefix=PREFIX, socket_timeout=1.0)
log = redis.Redis.from_url(URL)


@app.task(bind=True, base=RateLimitedTask, limiter=shared, name="call_api")
def call_api(self: Task, n: int) -> None:
    log.rpush(f"{PREFIX}:runs", json.dumps([n, self.request.retries]))


@signals.task_retry.connect
def _refused(request: Any = None, reason: Any = None, **_: Any) -> None:
    log.rpush(f"{PREFIX}:refused", json.dumps([request.args[0], request.retries, reason.when]))
