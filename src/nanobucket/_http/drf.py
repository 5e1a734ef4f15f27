"""The DRF throttle behind ``nanobucket.django.NanobucketThrottle``.

Importing DRF reads Django's settings, so the class on DRF's
``BaseThrottle`` is made at its first use (`throttle_class`, through
``nanobucket.django``'s module ``__getattr__``), when settings exist; the
logic is `_Throttle`, which needs no DRF.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Iterable, Mapping
from typing import Any

from django.conf import settings

from .._compose.hooks import Hook
from .django import SETTINGS, decide, django_gate, make_limiter, resolve
from .gate import Gate

#: The throttle's class and each subclass's gate are made once, even when
#: the first requests come at once (a limiter factory must run only once).
BUILDING = threading.RLock()


class _Throttle:
    """``NanobucketThrottle``: a DRF throttle, one atomic decision of a limiter per request.

    Keyed by user (``user:<pk>``) when authenticated, else by client
    address. Configure it by subclassing, with class attributes, or, for
    the class itself, with ``NANOBUCKET["throttle"]`` in settings (a
    dict of the same names):

    * ``limiter``: a limiter, a dotted path to one, or a function that makes one;
    * ``key`` (``"user"`` by default, or as for the middleware),
      ``trusted_proxies``, ``cost``, ``exempt_clients``, ``on_decision``,
      ``on_limited``.

    ``allow_request`` spends the tokens in the limiter's one atomic
    step (no read-then-write of a cache, so concurrent requests can
    never all pass), and ``wait()`` is the refusal's exact
    ``retry_after`` in seconds (DRF rounds it up for ``Retry-After``).

    >>> import nanobucket as nb
    >>> from nanobucket.django import NanobucketThrottle
    >>> class Burst(NanobucketThrottle):
    ...     limiter = nb.KeyedTokenBucket(rate=1, capacity=1, clock=lambda: 0)
    >>> from django.test.client import RequestFactory
    >>> request = RequestFactory().get("/")
    >>> [(t.allow_request(request, None), t.wait()) for t in (Burst(), Burst())]
    [(True, None), (False, 1.0)]
    """

    limiter: object = None
    key: object = "user"
    trusted_proxies: Iterable[str] | str | None = None
    cost: object = 1
    exempt_clients: object = None
    on_decision: Hook | None = None
    on_limited: Hook | None = None
    decision: Any = None

    @classmethod
    def gate(cls) -> Gate:
        """The class's configuration, built and checked once, at its first request.

        >>> import nanobucket as nb
        >>> from nanobucket.django import NanobucketThrottle
        >>> class Burst(NanobucketThrottle):
        ...     limiter = nb.KeyedTokenBucket(rate=1, capacity=1)
        >>> Burst.gate() is Burst.gate()
        True
        """
        gate = cls.__dict__.get("_nanobucket_gate")
        if gate is not None:
            return gate  # type: ignore[no-any-return]
        with BUILDING:  # the first requests may come at once: one gate (one made limiter)
            gate = cls.__dict__.get("_nanobucket_gate")
            if gate is None:
                gate = cls._build_gate()
                setattr(cls, "_nanobucket_gate", gate)  # noqa: B010 - in this class's own __dict__
            return gate

    @classmethod
    def _build_gate(cls) -> Gate:
        names = (
            "limiter",
            "key",
            "trusted_proxies",
            "cost",
            "exempt_clients",
            "on_decision",
            "on_limited",
        )
        config: dict[str, Any] = {n: _unwrap(inspect.getattr_static(cls, n)) for n in names}
        if config["limiter"] is None:
            fallback = getattr(settings, SETTINGS, {}).get("throttle")
            if not isinstance(fallback, Mapping) or "limiter" not in fallback:
                raise TypeError(
                    f"{cls.__name__} has no limiter: set limiter = ... on a subclass, "
                    f"or settings.{SETTINGS}['throttle'] = {{'limiter': ...}}"
                )
            unknown = set(fallback) - set(names)
            if unknown:
                raise ValueError(f"settings.{SETTINGS}['throttle']: unknown {sorted(unknown)}")
            config.update(fallback)
        for n in ("cost", "on_decision", "on_limited"):
            config[n] = resolve(config[n])
        limiter = make_limiter(config.pop("limiter"))
        # DRF throttles run synchronously: an asyncio limiter is refused here.
        return django_gate(limiter, asynchronous=False, headers="off", **config)

    def allow_request(self, request: Any, view: Any) -> bool:
        """Spend ``cost`` tokens of the request's key; False when refused.

        >>> import nanobucket as nb
        >>> from django.test.client import RequestFactory
        >>> from nanobucket.django import NanobucketThrottle
        >>> class One(NanobucketThrottle):
        ...     limiter = nb.KeyedTokenBucket(rate=1, capacity=1)
        >>> One().allow_request(RequestFactory().get("/"), None)
        True
        """
        gate = self.gate()
        label = type(view).__qualname__ if view is not None else type(self).__qualname__
        admitted, self.decision, _, _, _ = decide(gate, request, label)
        return admitted

    def wait(self) -> float | None:
        """Seconds until the refused request would be admitted, exactly; None if admitted.

        >>> import nanobucket as nb
        >>> from django.test.client import RequestFactory
        >>> from nanobucket.django import NanobucketThrottle
        >>> class Slow(NanobucketThrottle):
        ...     limiter = nb.KeyedTokenBucket(rate=3, capacity=1, clock=lambda: 0)
        >>> t = Slow(); t.allow_request(RequestFactory().get("/"), None)
        True
        >>> t = Slow(); t.allow_request(RequestFactory().get("/"), None), t.wait()
        (False, 0.333333334)
        """
        d = self.decision
        if d is None or d.allowed:
            return None
        return d.retry_after  # type: ignore[no-any-return]


def throttle_class() -> type:
    """``NanobucketThrottle``: `_Throttle` on DRF's ``BaseThrottle``, made at its first use."""
    try:
        from rest_framework.throttling import BaseThrottle
    except ImportError as exc:  # pragma: no cover - tested in a subprocess without DRF
        raise ImportError(
            "nanobucket.django.NanobucketThrottle needs Django REST framework: "
            "pip install djangorestframework"
        ) from exc
    namespace = {"__module__": "nanobucket.django", "__doc__": _Throttle.__doc__}
    return type("NanobucketThrottle", (_Throttle, BaseThrottle), namespace)


def _unwrap(value: object) -> object:
    return value.__func__ if isinstance(value, (staticmethod, classmethod)) else value
