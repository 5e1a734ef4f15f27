"""Hooks: a function the integrations call with each decision (`LimitEvent`).

Written here; documented and imported as ``nanobucket.hooks``."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable, Hashable
from typing import Any, NamedTuple

__all__ = ("LimitEvent",)

logger = logging.getLogger("nanobucket")

Hook = Callable[["LimitEvent"], Any]


class LimitEvent(NamedTuple):
    """One decision of an integration, as hooks see it: a read-only named tuple.

    * ``key``: the key the limiter was asked about (None for an unkeyed limiter
      under the decorator);
    * ``route``: the matched route pattern (``"/api/*"``; ``"*"`` when no
      route matched), the FastAPI route's path pattern, or the decorated
      function's qualified name: never a raw path, so it is a safe metric label;
    * ``cost``: the tokens asked for up front;
    * ``decision``: the limiter's `Decision` (a ``RedisDecision`` carries
      ``source``; an ``all_of`` one, ``layer``);
    * ``shadow``: the integration runs in shadow mode (it never refuses).

    >>> import nanobucket as nb
    >>> d = nb.TokenBucket(rate=1, capacity=1, clock=lambda: 0).check()
    >>> e = LimitEvent("alice", "/api/*", 1, d)
    >>> e.outcome, e.limited, e.plan
    ('admitted', False, None)
    """

    # A named tuple: built in one step on the request path (a hook hears of
    # every request), read-only, and cheap to pass to another thread.
    key: Hashable
    route: str
    cost: int
    decision: Any
    shadow: bool = False

    @property
    def plan(self) -> str | None:
        """The decision's ``plan`` when the limiter names the caller's plan, else None.

        >>> import nanobucket as nb
        >>> LimitEvent("alice", "*", 1, nb.TokenBucket(1, 1).check_at(0)).plan is None
        True
        """
        plan = getattr(self.decision, "plan", None)
        return plan if isinstance(plan, str) else None

    @property
    def limited(self) -> bool:
        """True when the limiter refused (whether or not shadow mode let it through).

        >>> import nanobucket as nb
        >>> b = nb.TokenBucket(rate=1, capacity=1, clock=lambda: 0); b.allow()
        True
        >>> LimitEvent(None, "*", 1, b.check(), shadow=True).limited
        True
        """
        return not self.decision.allowed

    @property
    def outcome(self) -> str:
        """``"admitted"``, ``"limited"`` (answered 429) or ``"shadow-limited"``.

        >>> import nanobucket as nb
        >>> b = nb.TokenBucket(rate=1, capacity=1, clock=lambda: 0); b.allow()
        True
        >>> LimitEvent(None, "*", 1, b.check()).outcome
        'limited'
        >>> LimitEvent(None, "*", 1, b.check(), shadow=True).outcome
        'shadow-limited'
        """
        if self.decision.allowed:
            return "admitted"
        return "shadow-limited" if self.shadow else "limited"


def _is_async_hook(hook: object, name: str, allow_async: bool) -> bool:
    """Whether *hook* is awaited; TypeError when it is not a usable hook."""
    if hook is None:
        return False
    if not callable(hook):
        raise TypeError(f"{name} must be a callable taking a LimitEvent, not {hook!r}")
    is_async = inspect.iscoroutinefunction(hook) or inspect.iscoroutinefunction(
        getattr(hook, "__call__", None)  # noqa: B004 - an object with async __call__
    )
    if is_async and not allow_async:
        raise TypeError(f"{name} is async, but this integration is synchronous: pass a function")
    return is_async


class Hooks:
    """The hooks of one integration: `emit` (sync) or `emit_async` calls them, safely."""

    __slots__ = ("awaited", "on_decision", "on_limited")

    def __init__(self, on_decision: Hook | None, on_limited: Hook | None, awaited: bool) -> None:
        self.on_decision = on_decision
        self.on_limited = on_limited
        self.awaited = awaited

    def emit(self, event: LimitEvent) -> None:
        """Call the hooks that apply to *event*; log what they raise."""
        if self.on_decision is not None:
            try:
                self.on_decision(event)
            except Exception:
                logger.exception("nanobucket: a hook raised on %r; the request goes on", event)
        if self.on_limited is not None and not event.decision.allowed:
            try:
                self.on_limited(event)
            except Exception:
                logger.exception("nanobucket: a hook raised on %r; the request goes on", event)

    async def emit_async(self, event: LimitEvent) -> None:
        """`emit`, awaiting what the hooks return when they are coroutines."""
        if not self.awaited:
            self.emit(event)
            return
        hooks = [self.on_decision]
        if not event.decision.allowed:
            hooks.append(self.on_limited)
        for hook in hooks:
            if hook is None:
                continue
            try:
                result = hook(event)
                if inspect.isawaitable(result):
                    await result
            except Exception:
                logger.exception("nanobucket: a hook raised on %r; the request goes on", event)


def make_hooks(on_decision: object, on_limited: object, *, allow_async: bool) -> Hooks | None:
    """Validate ``on_decision=`` / ``on_limited=``: None when neither is given."""
    a = _is_async_hook(on_decision, "on_decision", allow_async)
    b = _is_async_hook(on_limited, "on_limited", allow_async)
    if on_decision is None and on_limited is None:
        return None
    return Hooks(on_decision, on_limited, a or b)  # type: ignore[arg-type]
