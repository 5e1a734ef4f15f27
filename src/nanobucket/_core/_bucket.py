"""Picks the implementation: Cython unless told otherwise or unavailable."""

from __future__ import annotations

import os
import platform
import warnings
from typing import TYPE_CHECKING

NO_EXTENSIONS = os.environ.get("NANOBUCKET_NO_EXTENSIONS", "") not in ("", "0") or (
    platform.python_implementation() != "CPython"
)

#: Why the pure-Python twin runs although the extension was expected (its
#: ImportError, in one line), or "" when it was not expected or did import.
FALLBACK_REASON = ""

if TYPE_CHECKING or NO_EXTENSIONS:  # the typed pure-Python module is the source of the types
    from ._bucket_py import Decision, KeyedTokenBucket, TokenBucket
else:
    try:
        from ._bucket_c import Decision, KeyedTokenBucket, TokenBucket
    except ImportError as exc:  # a build without the extension (no C compiler at install)
        from ._bucket_py import Decision, KeyedTokenBucket, TokenBucket

        FALLBACK_REASON = f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"

IMPLEMENTATION = "python" if TokenBucket.__module__.endswith("_py") else "cython"


def fallback_warning() -> str:
    """The warning of a limiter built on the pure-Python twin that stands in for the extension."""
    return (
        "nanobucket is running its pure-Python implementation, several times slower "
        f"than its C extension, which did not import ({FALLBACK_REASON}). Reinstall "
        "nanobucket where a C compiler and the Python headers are available (with "
        "NANOBUCKET_REQUIRE_EXTENSIONS=1, an install that cannot compile fails instead), "
        "or set NANOBUCKET_NO_EXTENSIONS=1 to choose pure Python and silence this warning"
    )


def describe() -> str:
    """One line naming the implementation in use, and why it is the pure-Python one.

    >>> describe() in ("implementation: Cython extension",
    ...                "implementation: pure Python (NANOBUCKET_NO_EXTENSIONS is set)")
    True
    """
    if IMPLEMENTATION == "cython":
        return "implementation: Cython extension"
    if FALLBACK_REASON:
        return (
            "implementation: pure Python, several times slower: the C extension did not "
            f"import ({FALLBACK_REASON})"
        )
    if platform.python_implementation() != "CPython":
        return "implementation: pure Python (the extension needs CPython)"
    return "implementation: pure Python (NANOBUCKET_NO_EXTENSIONS is set)"


def _warn_fallback() -> None:
    """The warning, when the first limiter is built on the stand-in twin (see `_bucket_py`)."""
    # stacklevel 5: this function, `first_build`, `_new_limits`, `__init__`, the caller.
    warnings.warn(fallback_warning(), RuntimeWarning, stacklevel=5)


if FALLBACK_REASON:
    # When a limiter is built, not at import: importing nanobucket alone (a
    # tool's --help) says nothing, and the warning points at the user's line.
    from . import _bucket_py

    _bucket_py.on_first_build = _warn_fallback


def limiter_or_text(value: object) -> object:
    """*value*, or for a rate written as text (``"100/minute"``) a `KeyedTokenBucket` of it.

    Where a limiter is given (a middleware's, a route's, a plan), text stands
    for a bucket per key, its capacity the count.

    >>> limiter_or_text("5/minute").capacity, limiter_or_text(None)
    (5, None)
    """
    return KeyedTokenBucket(value) if isinstance(value, str) else value


__all__ = ("IMPLEMENTATION", "Decision", "KeyedTokenBucket", "TokenBucket", "limiter_or_text")
