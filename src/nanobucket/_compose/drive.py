"""Logic written once for threads and asyncio, as a generator of the calls it makes.

The generator yields ``(fn, args)`` and is sent what the call returned.
`drive` makes the calls, and `drive_async` awaits them. When a call raises,
the error goes on to the caller and the generator is closed where it
yielded: a ``try`` around that ``yield`` sees ``GeneratorExit``, and its
``except BaseException`` or ``finally`` can undo what the call was for.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import Any, TypeVar

Call = tuple[Callable[..., Any], tuple[Any, ...]]
T = TypeVar("T")


def drive(steps: Generator[Call, Any, T]) -> T:
    """Run *steps*, making each call it yields; its return value.

    >>> def twice(x):
    ...     y = yield abs, (x,)
    ...     return 2 * y
    >>> drive(twice(-3))
    6
    """
    try:
        fn, args = next(steps)
        while True:
            fn, args = steps.send(fn(*args))
    except StopIteration as done:
        result: T = done.value
        return result
    finally:
        steps.close()


async def drive_async(steps: Generator[Call, Any, T]) -> T:
    """`drive`, awaiting each call.

    >>> import asyncio
    >>> def slept(seconds):
    ...     yield asyncio.sleep, (seconds,)
    ...     return seconds
    >>> asyncio.run(drive_async(slept(0)))
    0
    """
    try:
        fn, args = next(steps)
        while True:
            fn, args = steps.send(await fn(*args))
    except StopIteration as done:
        result: T = done.value
        return result
    finally:
        steps.close()
