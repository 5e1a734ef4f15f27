"""Key by client address: `client_address`, with proxies it trusts.

The default key of every integration. A request's address is its socket
peer, or, behind proxies given as trusted, the first address in
``X-Forwarded-For`` (read from the right) that no trusted proxy wrote.
"""

from __future__ import annotations

import ipaddress
import threading
import warnings
from collections.abc import Iterable
from typing import Any

from .views import KeyFunc, View

__all__ = ("client_address",)

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


UNIX = "unix:"
_WARN_LOCK = threading.Lock()


def _networks(trusted: Iterable[str] | str | None) -> tuple[tuple[IPNetwork, ...], bool]:
    """The trusted networks, and whether the peer of a unix socket is trusted."""
    if trusted is None:
        return (), False
    if isinstance(trusted, str):
        trusted = [trusted]
    nets = []
    unix = False
    for item in trusted:
        if not isinstance(item, str):
            raise TypeError(f"trusted proxies must be str addresses or networks, not {item!r}")
        if item.strip() == UNIX:
            unix = True
            continue
        try:
            nets.append(network(item))
        except ValueError:
            raise ValueError(f"not an IP address or network (or 'unix:'): {item!r}") from None
    return tuple(nets), unix


def network(text: str) -> IPNetwork:
    """An address or network as written (host bits allowed); IPv4-mapped as IPv4.

    >>> network("::ffff:10.0.0.0/104"), network("1.2.3.4")
    (IPv4Network('10.0.0.0/8'), IPv4Network('1.2.3.4/32'))
    """
    net = ipaddress.ip_network(text.strip(), strict=False)
    if isinstance(net, ipaddress.IPv6Network) and net.prefixlen >= 96:
        mapped = net.network_address.ipv4_mapped
        if mapped is not None:  # "::ffff:10.0.0.0/104" is 10.0.0.0/8
            net = ipaddress.ip_network(f"{mapped}/{net.prefixlen - 96}")
    return net


def _parse_ip(text: str) -> IPAddress | None:
    """An address from an ``X-Forwarded-For`` entry or a peer; IPv4-mapped as IPv4."""
    text = text.strip()
    if text.startswith("[") and "]" in text:  # "[::1]:8080" -> "::1"
        text = text[1 : text.index("]")]
    elif text.count(":") == 1:  # "1.2.3.4:5678" -> "1.2.3.4"
        text = text.split(":", 1)[0]
    if len(text) > 64:  # longer than any address with a zone: not one
        return None
    try:
        addr = ipaddress.ip_address(text)
    except ValueError:
        return None
    if isinstance(addr, ipaddress.IPv6Address) and addr.ipv4_mapped is not None:
        return addr.ipv4_mapped
    return addr


def _prefix_bits(ipv6_prefix: object) -> int:
    if isinstance(ipv6_prefix, bool) or not isinstance(ipv6_prefix, int):
        raise TypeError(f"ipv6_prefix must be an int, not {ipv6_prefix!r}")
    if not 1 <= ipv6_prefix <= 128:
        raise ValueError(f"ipv6_prefix must be 1..128, got {ipv6_prefix}")
    return ipv6_prefix


class client_address(KeyFunc):  # lower case: reads as a function at the call site
    """Key by client IP address (the default key).

    An IPv4-mapped address (``::ffff:1.2.3.4``) is its IPv4 address; an IPv6
    client is keyed by its network of *ipv6_prefix* bits (default 64, as
    one host is usually given a whole /64 and could otherwise take a fresh
    bucket per address).

    ``X-Forwarded-For`` is ignored unless ``trusted_proxies`` is given. With
    it, the header is read from the right while the hop that wrote the entry
    is a trusted proxy; the first untrusted address is the client. A client
    cannot forge its way to a fresh bucket: entries it wrote itself lie left
    of the one a trusted proxy appended, and are never reached. An entry that
    is not an address stops the walk at the last trusted hop (several
    clients then share that bucket: stricter, never looser).
    ``"unix:"`` in ``trusted_proxies`` trusts the peer of a unix socket
    (uvicorn ``--uds``, gunicorn ``unix:``), which has no address.

    >>> client_address(trusted_proxies=["10.0.0.0/8"]).wsgi(
    ...     {"REMOTE_ADDR": "10.0.0.2", "HTTP_X_FORWARDED_FOR": "6.6.6.6, 1.2.3.4"})
    '1.2.3.4'
    >>> client_address().wsgi({"REMOTE_ADDR": "2001:db8:1:2:3:4:5:6"})
    '2001:db8:1:2::/64'
    """

    __slots__ = ("_prefix", "_reads_header", "_trusted", "_unix", "_warned")

    def __init__(
        self, trusted_proxies: Iterable[str] | str | None = None, *, ipv6_prefix: int = 64
    ) -> None:
        self._trusted, self._unix = _networks(trusted_proxies)
        self._prefix = _prefix_bits(ipv6_prefix)
        self._reads_header = bool(self._trusted) or self._unix  # some proxy is trusted
        self._warned = False

    def _is_trusted(self, addr: IPAddress) -> bool:
        return any(addr in net for net in self._trusted)

    def _key(self, addr: IPAddress) -> str:
        if isinstance(addr, ipaddress.IPv4Address):
            return str(addr)
        bits = int(addr)  # int(): no "%zone", which a header could vary freely
        if self._prefix == 128:
            return str(ipaddress.IPv6Address(bits))
        drop = 128 - self._prefix
        return f"{ipaddress.IPv6Address(bits >> drop << drop)}/{self._prefix}"

    def peer_key(self, peer: str) -> str:
        """The key of a socket peer seen directly (no proxy header read).

        >>> client_address().peer_key("::ffff:1.2.3.4")
        '1.2.3.4'
        """
        if ":" not in peer:
            if not peer or peer[0] == "/":  # a unix socket (gunicorn: its path, if bound)
                self._no_address()
            return peer  # IPv4 as the server wrote it: the hot case
        addr = _parse_ip(peer)
        return peer if addr is None else self._key(addr)

    def _no_address(self) -> None:
        if self._warned or self._unix:
            return
        with _WARN_LOCK:  # once, even when threads meet here together
            if self._warned:
                return
            self._warned = True
        warnings.warn(
            "a request arrived with no peer address (a unix socket?): every such "
            "client shares one bucket; behind a proxy on a unix socket, pass "
            "client_address(trusted_proxies=['unix:']) so its X-Forwarded-For is read",
            RuntimeWarning,
            stacklevel=2,
        )

    def resolve(self, peer: str, forwarded_for: str | None) -> str:
        """The client address given the socket peer and ``X-Forwarded-For``.

        >>> client_address(trusted_proxies="10.0.0.0/8").resolve("10.0.0.2", "6.6.6.6, 1.2.3.4")
        '1.2.3.4'
        >>> client_address().resolve("10.0.0.2", "1.2.3.4")   # no proxy trusted: the peer
        '10.0.0.2'
        >>> client_address(trusted_proxies="unix:").resolve("", "1.2.3.4")
        '1.2.3.4'
        """
        if not peer or peer[0] == "/":  # a unix socket: no address
            if not self._unix:
                self._no_address()
                return peer
            current: IPAddress | None = None
        else:
            current = _parse_ip(peer)
            if current is None or not self._is_trusted(current) or not forwarded_for:
                return self.peer_key(peer)
        if not forwarded_for:
            return ""  # a trusted unix peer that named no client
        current = self._walk(current, forwarded_for)
        return "" if current is None else self._key(current)

    def _walk(self, current: IPAddress | None, forwarded_for: str) -> IPAddress | None:
        """The client a trusted peer (*current*, None for a unix socket) names in the header."""
        # Walk from the right without splitting: a long header costs one pass.
        end = len(forwarded_for)
        while end >= 0:
            start = forwarded_for.rfind(",", 0, end)
            hop = _parse_ip(forwarded_for[start + 1 : end])
            if hop is None:
                break
            current = hop
            if not self._is_trusted(hop):
                break
            end = start
        return current

    def _ip(self, view: View, request: Any) -> IPAddress | None:
        """The client's address as an `ipaddress` object, read as `read` reads it; None
        when there is none (a unix socket, a trusted proxy that named no client).

        The whole address, where the key of an IPv6 client is its network:
        what ``exempt_clients=`` compares with its networks (read by `ExemptClients`
        in clients.py; the tests of ``exempt_clients`` show it
        through every integration).
        """
        peer = view.peer(request)
        if not peer or peer[0] == "/":  # a unix socket: no address of its own
            if not self._unix:
                return None
            forwarded_for = view.header(request, "x-forwarded-for")
            return self._walk(None, forwarded_for) if forwarded_for else None
        addr = _parse_ip(peer)
        if addr is None or not self._reads_header or not self._is_trusted(addr):
            return addr
        forwarded_for = view.header(request, "x-forwarded-for")
        return self._walk(addr, forwarded_for) if forwarded_for else addr

    def client(self) -> client_address:
        """This key reads the client address itself (see `KeyFunc.client`).

        >>> key = client_address(trusted_proxies="10.0.0.0/8")
        >>> key.client() is key
        True
        """
        return self

    def read(self, view: View, request: Any) -> str:
        """The client address of *request*: its peer, or the client a trusted proxy names.

        >>> from nanobucket.asgi import client_address
        >>> client_address().asgi({"type": "http", "client": ("1.2.3.4", 5678)})
        '1.2.3.4'
        >>> client_address(trusted_proxies="10.0.0.0/8").wsgi(
        ...     {"REMOTE_ADDR": "10.0.0.2", "HTTP_X_FORWARDED_FOR": "1.2.3.4"})
        '1.2.3.4'
        """
        peer = view.peer(request)
        if not self._reads_header:
            return self.peer_key(peer)  # the hot default: no header is even looked at
        return self.resolve(peer, view.header(request, "x-forwarded-for"))

    def __repr__(self) -> str:
        nets = [str(n) for n in self._trusted] + ([UNIX] if self._unix else [])
        extra = f", ipv6_prefix={self._prefix}" if self._prefix != 64 else ""
        return f"client_address(trusted_proxies={nets!r}{extra})"
