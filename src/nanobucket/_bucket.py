"""Picks the implementation: Cython unless told otherwise or unavailable."""

from __future__ import annotations

import os
import platform
from typing import TYPE_CHECKING

NO_EXTENSIONS = os.environ.get("NANOBUCKET_NO_EXTENSIONS", "") not in ("", "0") or (
    platform.python_implementation() != "CPython"
)

if TYPE_CHECKING or NO_EXTENSIONS:  # the typed pure-Python module is the source of the types
    from ._bucket_py import Decision, KeyedTokenBucket, TokenBucket
else:
    try:
        from ._bucket_c import Decision, KeyedTokenBucket, TokenBucket
    except ImportError:  # pragma: no cover - a build without the extension
        from ._bucket_py import Decision, KeyedTokenBucket, TokenBucket

IMPLEMENTATION = "python" if TokenBucket.__module__.endswith("_py") else "cython"

__all__ = ("IMPLEMENTATION", "Decision", "KeyedTokenBucket", "TokenBucket")
