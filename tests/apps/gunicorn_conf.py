"""gunicorn config for the real-server tests: the shared table is made once, in the master."""

from __future__ import annotations

import os
from typing import Any


def on_starting(server: Any) -> None:
    path = os.environ.get("NB_SHARED_PATH")
    if path:
        import nanobucket as nb

        nb.SharedKeyedTokenBucket.create(
            path=path, rate=float(os.environ["NB_RATE"]), capacity=int(os.environ["NB_CAPACITY"])
        ).close()


def on_exit(server: Any) -> None:
    path = os.environ.get("NB_SHARED_PATH")
    if path and os.path.exists(path):
        os.unlink(path)
