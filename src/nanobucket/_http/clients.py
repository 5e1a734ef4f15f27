"""Clients never limited (``exempt_clients=``): addresses, networks and predicates.

A request from an exempt client spends no token and is never refused, on
every route; it gets no rate-limit fields (no limit was consulted), as a
request on an exempt path. Its address is read as the gate's key reads it
(`client_address`, trusted proxies and all), so a client behind a trusted
proxy is matched by its own address, and a client cannot claim an exempt
address in ``X-Forwarded-For`` unless a trusted proxy wrote it.
"""

from __future__ import annotations

import inspect
import ipaddress
from collections.abc import Callable
from typing import Any

from .address import IPNetwork, client_address, network
from .views import View

__all__ = ("ExemptClients", "exempt_clients")

Predicate = Callable[[Any], bool]
_IP_OBJECTS = (
    ipaddress.IPv4Address,
    ipaddress.IPv6Address,
    ipaddress.IPv4Network,
    ipaddress.IPv6Network,
)


class ExemptClients:
    """Which requests come from an exempt client: an address in *networks*, or a
    predicate of *predicates* that returns True for the request.

    *address* reads a request's client address (the gate's key's).

    >>> from nanobucket._http.views import SCOPE
    >>> clients = exempt_clients(["10.0.0.0/8", "::1"], client_address())
    >>> [clients.exempts(SCOPE, {"client": (ip, 5)}) for ip in ("10.1.2.3", "::1", "1.2.3.4")]
    [True, True, False]
    """

    __slots__ = ("_address", "_networks", "_predicates")

    def __init__(
        self,
        networks: tuple[IPNetwork, ...],
        predicates: tuple[Predicate, ...],
        address: client_address,
    ) -> None:
        self._networks = networks
        self._predicates = predicates
        self._address = address

    def exempts(self, view: View, request: Any) -> bool:
        """Whether *request* (as the integration's callables get it) is from an exempt client."""
        if self._networks:
            addr = self._address._ip(view, request)  # the gate's reading, shared in _http
            if addr is not None:
                for net in self._networks:
                    if addr in net:
                        return True
        for predicate in self._predicates:
            verdict = predicate(request)
            if verdict is True:
                return True
            if verdict is not False:
                # A truthy coroutine or object would exempt everyone: say so instead.
                raise TypeError(
                    f"an exempt_clients predicate must return a bool, "
                    f"{predicate!r} returned {verdict!r}"
                )
        return False

    def __repr__(self) -> str:
        shown: list[str] = [str(n) for n in self._networks]
        shown += [repr(p) for p in self._predicates]
        return f"ExemptClients({shown!r})"


def exempt_clients(spec: object, address: client_address) -> ExemptClients | None:
    """Validate ``exempt_clients=``: an address or network (text or `ipaddress`), a
    predicate taking the request, or a list of them; None for none.

    >>> exempt_clients("10.0.0.0/8", client_address())
    ExemptClients(['10.0.0.0/8'])
    >>> exempt_clients(["10.0.0.300"], client_address())
    Traceback (most recent call last):
    ...
    ValueError: exempt_clients: not an IP address or network: '10.0.0.300'
    """
    if spec is None:
        return None
    items = spec if isinstance(spec, (list, tuple, set, frozenset)) else [spec]
    networks: list[IPNetwork] = []
    predicates: list[Predicate] = []
    for item in items:
        if isinstance(item, str):
            try:
                networks.append(network(item))
            except ValueError:
                raise ValueError(
                    f"exempt_clients: not an IP address or network: {item!r}"
                ) from None
        elif isinstance(item, _IP_OBJECTS):
            networks.append(network(str(item)))
        elif callable(item) and not isinstance(item, type):
            if inspect.iscoroutinefunction(item) or inspect.iscoroutinefunction(
                getattr(item, "__call__", None)  # noqa: B004 - an object with async __call__
            ):
                raise TypeError(
                    f"an exempt_clients predicate must be a plain function returning a "
                    f"bool, not a coroutine function: {item!r}"
                )
            predicates.append(item)
        else:
            raise TypeError(
                "exempt_clients takes addresses or networks ('10.0.0.0/8', an ipaddress "
                f"object), predicates taking the request, or a list of them, not {item!r}"
            )
    if not networks and not predicates:
        return None
    return ExemptClients(tuple(networks), tuple(predicates), address)
