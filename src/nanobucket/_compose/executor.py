"""``LimitedExecutor``: a worker pool whose tasks start no faster than a limiter allows.

Written here; documented and imported as ``nanobucket.executor``."""

from __future__ import annotations

import functools
import queue
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Generator, Hashable, Iterable
from concurrent.futures import CancelledError, Executor, Future
from typing import Any, TypeVar

from .._core import _wait
from .._core._limiter import Refundable, Reservable, Reservation, is_keyed, traits
from .._core._params import FOREVER_NS, int_at_least, validated_cost, validated_timeout
from .decorator import RateLimited
from .waiting import Waiting

__all__ = ("DEFAULT_MAX_PENDING", "LimitedExecutor", "QueueFull")

DEFAULT_MAX_PENDING = 1024
_T = TypeVar("_T")


class QueueFull(queue.Full):
    """Raised by `LimitedExecutor.submit` when *max_pending* tasks wait to start.

    >>> import queue
    >>> issubclass(QueueFull, queue.Full)
    True
    """


# Raised to the caller: shown (and pickled) under its public path.
QueueFull.__module__ = "nanobucket.executor"


class _Abandoned(BaseException):
    """The task at the head was cancelled while it waited for its tokens."""


def key_prefix(limiter: Any, key: Hashable | None) -> tuple[Hashable, ...]:
    """The arguments before ``cost`` in *limiter*'s verbs: ``(key,)`` or ``()``.

    >>> import nanobucket as nb
    >>> key_prefix(nb.TokenBucket(1, 1), None), key_prefix(nb.KeyedTokenBucket(1, 1), "api")
    ((), ('api',))
    """
    if is_keyed(limiter):
        if key is None and not traits(limiter).key_optional:
            raise TypeError(f"{type(limiter).__name__} is keyed: pass key=<the key to spend from>")
        return (key,)
    if key is not None:
        raise TypeError(f"{type(limiter).__name__} is not keyed: key= has no bucket to pick")
    return ()


def checked_cost(limiter: Any, cost: object) -> int:
    """*cost* as an int in ``[0, limiter.capacity]`` (when it has one), or raise."""
    capacity = traits(limiter).capacity
    return validated_cost(cost, FOREVER_NS if capacity is None else capacity)


class _Task:
    __slots__ = ("args", "fn", "future", "kwargs")

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]):
        self.future: Future[Any] = Future()
        self.fn = fn
        self.args = args
        self.kwargs = kwargs


_live: weakref.WeakSet[LimitedExecutor] = weakref.WeakSet()


@functools.cache
def _register_exit_hook() -> None:
    # Called when a pacing thread first starts: after the wrapped pool's module
    # registered its own hook, so this one runs before it.
    threading._register_atexit(_at_exit)  # type: ignore[attr-defined]


def _at_exit() -> None:
    # Before the stdlib pools' own exit hook (registered earlier, run later):
    # the tasks still queued start at their times, as a pool's queued work runs.
    for executor in list(_live):
        executor.shutdown(wait=True)


class LimitedExecutor(Executor):
    """Start the tasks of *executor* no faster than *limiter* allows, first in, first out.

    *limiter* is an in-process ``TokenBucket``, ``KeyedTokenBucket`` (give
    *key*), ``all_of``, ``Waiting`` / ``LeakyBucket`` (their line and
    sleeps), or a ``RedisTokenBucket`` (a limit shared with other machines);
    each task spends *cost* tokens. At most *max_pending* tasks wait to
    start; past it `submit` blocks up to *timeout* seconds (None: until
    there is room), then raises `QueueFull`. With *max_in_flight*, a task
    also waits until fewer than that many started tasks are unfinished (the
    wrapped executor's own queue then stays bounded too). ``shutdown`` shuts
    *executor* down as well.

    >>> from concurrent.futures import ThreadPoolExecutor
    >>> import nanobucket as nb
    >>> slept = []   # the bucket's clock stands still at 0; sleep= records each wait
    >>> paced = nb.Waiting(nb.TokenBucket(rate=10, capacity=2, clock=lambda: 0), sleep=slept.append)
    >>> with LimitedExecutor(ThreadPoolExecutor(2), paced) as pool:
    ...     results = [pool.submit(abs, -i).result() for i in range(4)]
    >>> results, slept   # a burst of 2, then the 3rd waits until 0.1 s and the 4th until 0.2 s
    ([0, 1, 2, 3], [0.1, 0.2])
    """

    def __init__(
        self,
        executor: Executor,
        limiter: Any,
        *,
        max_pending: int = DEFAULT_MAX_PENDING,
        timeout: float | None = None,
        max_in_flight: int | None = None,
        key: Hashable | None = None,
        cost: int = 1,
    ) -> None:
        if not isinstance(executor, Executor):
            raise TypeError(f"executor must be a concurrent.futures.Executor, not {executor!r}")
        sleep_or_wake: _wait.SleepOrWake = _wait.bell_wait
        shape = False
        inner = limiter
        if isinstance(limiter, Waiting):
            inner, shape, sleep_or_wake = limiter.limiter, limiter.shape, limiter.sleep_or_wake
        if not isinstance(inner, Reservable) or not isinstance(inner, Refundable):
            raise TypeError(
                f"{type(inner).__name__} cannot reserve tokens: LimitedExecutor needs a "
                "TokenBucket, KeyedTokenBucket, all_of, Waiting or RedisTokenBucket"
            )
        self._limiter = inner
        self._shape = shape
        self._key = key_prefix(inner, key)
        self._cost = checked_cost(inner, cost)
        self._max_pending = int_at_least(max_pending, "max_pending", 1)
        self._max_in_flight = (
            None if max_in_flight is None else int_at_least(max_in_flight, "max_in_flight", 1)
        )
        self._timeout = validated_timeout(timeout)
        self._executor = executor
        # The pacing thread's sleep: the limiter's own, cut short when its task is cancelled.
        if isinstance(sleep_or_wake, _wait.PlainSleep):
            plain = sleep_or_wake.sleep
            self._sleep_or_wake: _wait.SleepOrWake = _wait.PlainSleep(
                lambda seconds: self._checked(lambda: plain(seconds))
            )
        else:
            self._sleep_or_wake = lambda bell, seconds: self._checked(
                lambda: sleep_or_wake(bell, seconds), bell
            )
        self._cond = threading.Condition(threading.Lock())
        self._pending: deque[_Task] = deque()
        self._in_flight = 0
        self._head: _Task | None = None
        self._bell: _wait.Bell | None = None
        self._abandon = False
        self._shutdown = False
        self._cancel_futures = False
        self._thread: threading.Thread | None = None

    @property
    def pending(self) -> int:
        """Tasks submitted and not started yet (at most `max_pending`).

        >>> from concurrent.futures import ThreadPoolExecutor
        >>> import nanobucket as nb
        >>> LimitedExecutor(ThreadPoolExecutor(1), nb.TokenBucket(1, 1)).pending
        0
        """
        return len(self._pending)

    @property
    def max_pending(self) -> int:
        """The most tasks that may wait to start.

        >>> from concurrent.futures import ThreadPoolExecutor
        >>> import nanobucket as nb
        >>> LimitedExecutor(ThreadPoolExecutor(1), nb.TokenBucket(1, 1), max_pending=8).max_pending
        8
        """
        return self._max_pending

    def submit(self, fn: Callable[..., _T], /, *args: Any, **kwargs: Any) -> Future[_T]:
        """Queue ``fn(*args, **kwargs)`` to start when its tokens exist; its `Future`.

        Blocks while *max_pending* tasks wait to start, at most *timeout*
        seconds, then raises `QueueFull`; after ``shutdown``, RuntimeError.

        >>> from concurrent.futures import ThreadPoolExecutor
        >>> import nanobucket as nb
        >>> with LimitedExecutor(ThreadPoolExecutor(1), nb.TokenBucket(10, 1)) as pool:
        ...     pool.submit(sum, [1, 2, 3]).result()
        6
        """
        task = _Task(fn, args, kwargs)
        with self._cond:
            self._wait_for_room(self._timeout)
            task.future.add_done_callback(self._done)
            self._pending.append(task)
            if self._thread is None:
                self._start()
            self._cond.notify_all()
        return task.future

    def _wait_for_room(self, timeout: float | None) -> None:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            if len(self._pending) < self._max_pending:
                return
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise QueueFull(f"{self._max_pending} tasks already wait to start")
            self._cond.wait(left)

    def _start(self) -> None:
        _register_exit_hook()
        _live.add(self)
        self._thread = threading.Thread(target=self._run, name="nanobucket-pacer")
        self._thread.start()

    def _done(self, future: Future[Any]) -> None:
        """A future settled: if cancelled while it waited, it leaves the queue."""
        if not future.cancelled():
            return
        bell = None
        with self._cond:
            for task in self._pending:
                if task.future is future:
                    self._pending.remove(task)
                    if task is self._head:  # it is waiting for its tokens: give them back
                        self._abandon = True
                        bell = self._bell
                    self._cond.notify_all()
                    break
        if bell is not None:
            bell.set()

    def _checked(self, sleep: Callable[[], _T], bell: _wait.Bell | None = None) -> _T:
        """Run the pacing thread's *sleep*, unless (or until) its task is cancelled."""
        with self._cond:
            if self._abandon:
                raise _Abandoned
            self._bell = bell
        result = sleep()
        with self._cond:
            if self._abandon:
                raise _Abandoned
        return result

    def _has_room(self) -> bool:
        return self._max_in_flight is None or self._in_flight < self._max_in_flight

    def _run(self) -> None:
        """The pacing thread: the head's tokens, then the head to the wrapped executor."""
        cond, pending = self._cond, self._pending
        while True:
            task: _Task | None = None
            with cond:
                while not (pending and self._has_room()):
                    if not pending and self._shutdown:
                        break
                    cond.wait()
                else:
                    task = self._head = pending[0]
                    self._abandon = False
                    self._bell = None
            if task is None:  # shut down, nothing left to start
                # Outside the lock: the wrapped pool's cancellations call back into _finished.
                self._thread_exit()
                return
            error: BaseException | None = None
            reserved: Reservation | None = None
            try:
                reserved = _wait.wait_sync(
                    self._limiter,
                    self._key,
                    self._cost,
                    FOREVER_NS,
                    self._shape,
                    self._sleep_or_wake,
                )
            except _Abandoned:
                pass  # its reservation was given back
            except Exception as e:  # the limiter failed (Redis down...): the task fails
                error = e
            started = reserved is not None and reserved.ok
            with cond:
                self._head = None
                if pending and pending[0] is task:
                    pending.popleft()
                    cond.notify_all()
                # Decided under the lock: once shutdown(cancel_futures=True) began, nothing starts.
                run = started and not self._cancel_futures
                run = run and task.future.set_running_or_notify_cancel()
                if run:
                    self._in_flight += 1
            if run:
                self._hand_over(task)
            elif reserved is not None and started:  # cancelled as its tokens came: back
                reserved.cancel()
                task.future.cancel()
            elif error is not None and task.future.set_running_or_notify_cancel():
                task.future.set_exception(error)
            elif not task.future.cancelled() and task.future.set_running_or_notify_cancel():
                task.future.set_exception(RateLimited(0))  # the limiter refused to reserve
            del task

    def _hand_over(self, task: _Task) -> None:
        outer = task.future
        try:
            inner = self._executor.submit(task.fn, *task.args, **task.kwargs)
        except BaseException as e:
            self._finished(None)
            outer.set_exception(e)
            return
        inner.add_done_callback(lambda f: self._copy(f, outer))

    def _finished(self, _: object) -> None:
        with self._cond:
            self._in_flight -= 1
            self._cond.notify_all()

    def _copy(self, inner: Future[Any], outer: Future[Any]) -> None:
        self._finished(None)
        if inner.cancelled():  # by the wrapped executor's shutdown(cancel_futures=True)
            outer.set_exception(CancelledError())
        elif inner.exception() is not None:
            outer.set_exception(inner.exception())
        else:
            outer.set_result(inner.result())

    def _thread_exit(self) -> None:
        """The pacing thread is done (shutdown, nothing left): the wrapped pool follows."""
        if self._cancel_futures:
            self._executor.shutdown(wait=False, cancel_futures=True)
        else:
            self._executor.shutdown(wait=False)

    def map(
        self,
        fn: Callable[..., _T],
        *iterables: Iterable[Any],
        timeout: float | None = None,
        chunksize: int = 1,
    ) -> Generator[_T, None, None]:
        """``Executor.map``, read lazily: at most *max_pending* calls outstanding at once.

        Results come in order; *timeout* counts from this call, as in the
        standard library, and the calls not yet started are cancelled when
        the iterator is left early. Each call is paced on its own
        (*chunksize* is accepted and ignored).

        >>> from concurrent.futures import ThreadPoolExecutor
        >>> import nanobucket as nb
        >>> pool = LimitedExecutor(ThreadPoolExecutor(2), nb.TokenBucket(100, 10), max_pending=2)
        >>> with pool:
        ...     list(pool.map(str.upper, ["a", "b", "c"]))
        ['A', 'B', 'C']
        """
        seconds = validated_timeout(timeout)
        end = None if seconds is None else time.monotonic() + seconds
        calls = zip(*iterables)
        window: deque[Future[_T]] = deque()

        def fill() -> None:
            for args in calls:
                window.append(self.submit(fn, *args))
                with self._cond:
                    if len(window) >= self._max_pending or len(self._pending) >= self._max_pending:
                        return

        def results() -> Generator[_T, None, None]:
            try:
                while window:
                    future = window.popleft()
                    try:
                        result = future.result(None if end is None else end - time.monotonic())
                    except BaseException:  # timed out (or failed): it must not start later
                        future.cancel()
                        raise
                    yield result
                    if len(window) < self._max_pending:
                        fill()
            finally:
                for future in window:
                    future.cancel()

        fill()  # the first calls start now, as the standard library's map starts them all
        return results()

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """No new tasks; with *cancel_futures*, the tasks not started are cancelled.

        The queued tasks otherwise still start at their times. With *wait*,
        return once every task has finished and the pacing thread is gone.

        >>> from concurrent.futures import ThreadPoolExecutor
        >>> import nanobucket as nb
        >>> pool = LimitedExecutor(ThreadPoolExecutor(1), nb.TokenBucket(rate=1, capacity=1))
        >>> first = pool.submit(abs, -1); first.result()
        1
        >>> second = pool.submit(abs, -2)   # would wait 1 s for its token
        >>> pool.shutdown(cancel_futures=True)
        >>> second.cancelled(), pool.pending
        (True, 0)
        """
        with self._cond:
            self._shutdown = True
            self._cancel_futures = self._cancel_futures or cancel_futures
            cancel = list(self._pending) if cancel_futures else []
            thread = self._thread
            self._cond.notify_all()
        for task in cancel:
            task.future.cancel()
        if thread is None:
            self._thread_exit()
        elif wait and thread is not threading.current_thread():
            thread.join()
        if wait:
            self._executor.shutdown(wait=True)
        _live.discard(self)

    def __repr__(self) -> str:
        return (
            f"LimitedExecutor({self._executor!r}, {self._limiter!r}, "
            f"max_pending={self._max_pending}, pending={self.pending})"
        )
