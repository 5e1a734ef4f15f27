"""The sync limiters' script calls on connections of their own, past redis-py's command layer.

A sync decision spent about 33 us of client CPU in redis-py's command layer
(the pool's checkout and observability, argument packing, the parser) for one
``EVALSHA`` of a fixed shape. :class:`Wire` sends that command pre-encoded on
a connection of the limiter's own and reads its reply (an integer, a bulk
string, an array of those, or an error) with a small parser of its own.

The connections are made by the client's own connection class from its
pool's parameters, so TLS, credentials, db selection, unix sockets, client
name and timeouts are as the client has them, and they connect (handshake
included) as redis-py does. Errors are the client library's own classes,
raised where redis-py raises them: a lost or timed-out connection is closed.
Anything unusual takes redis-py's path instead: a cluster client, another
library's client, a pool or connection class of another kind, RESP3, client-
side caching (`Wire.of` answers None), a ``NOSCRIPT`` reply (the script is
loaded and run through redis-py: ``NOSCRIPT`` ran nothing), an argument of
another type, and a call while the limiter has as many connections of its own
as the pool may hold.
"""

from __future__ import annotations

import importlib
import math
import os
import select
import socket
import struct
import sys
import threading
import weakref
from collections.abc import Sequence
from typing import Any

from . import _clients

__all__ = ("BUSY", "Wire", "WireScript")

#: Reads of at most this many bytes: every reply of the limiters' scripts fits one.
_READ = 65536
_CRLF = b"\r\n"


class Wire:
    """Connections of a limiter's own to the server of a plain sync client (see the module)."""

    def __init__(self, lib: _clients.Library, pool: Any) -> None:
        self._cls = pool.connection_class
        self._kwargs = dict(pool.connection_kwargs)
        #: Never more connections of its own than the pool may hold; past
        #: that (threads beyond it at once) calls go through the pool.
        self._cap = int(pool.max_connections)
        self._free: list[_Conn] = []  # idle connections: list.pop/append are atomic
        self._made = 0
        self._lock = threading.Lock()
        errors = importlib.import_module(f"{lib.name}.exceptions")
        self._timeout_error: type[Exception] = errors.TimeoutError
        self._connection_error: type[Exception] = errors.ConnectionError
        self._invalid: type[Exception] = errors.InvalidResponse
        self._noscript: type[Exception] = errors.NoScriptError
        _wires.add(self)

    @classmethod
    def of(cls, client: Any) -> Wire | None:
        """A wire to *client*'s server, or None when its calls must go through redis-py:
        a cluster client, another library's, a pool, connection class or protocol
        (RESP3) of another kind, client-side caching, a platform without ``poll``."""
        lib = _clients.library_of(client)
        if lib is None or type(client) is not lib.client or not hasattr(select, "poll"):
            return None
        pool: Any = getattr(client, "connection_pool", None)
        if type(pool) not in (lib.pool, lib.blocking_pool) or getattr(pool, "cache", None):
            return None
        mod = importlib.import_module(lib.name)
        kinds = (mod.Connection, mod.SSLConnection, mod.UnixDomainSocketConnection)
        kwargs = pool.connection_kwargs
        if pool.connection_class not in kinds or kwargs.get("protocol") not in (None, 2, "2"):
            return None
        return cls(lib, pool)

    def script(self, script: Any) -> WireScript:
        """*script* (a redis-py ``Script``) called through this wire."""
        return WireScript(self, script)

    def close(self) -> None:
        """Close the connections of its own (those in use close as they come back)."""
        self._cap = 0
        while self._free:
            self._free.pop().conn.disconnect()

    def _forget(self) -> None:
        # In a forked child: the parent's sockets are the parent's (redis-py's
        # connections close only their own pid's when collected).
        self._free = []
        self._made = 0
        self._lock = threading.Lock()

    # -- one call ------------------------------------------------------------------

    def _take(self) -> _Conn | None:
        """An idle connection of its own, a new one, or None (as many as the pool may hold)."""
        try:
            return self._free.pop()
        except IndexError:
            pass
        with self._lock:
            if self._made >= self._cap:
                return None
            self._made += 1
        return _Conn(self._cls(**self._kwargs))

    def _give(self, conn: _Conn) -> None:
        if self._cap:
            self._free.append(conn)
        else:  # closed meanwhile
            conn.conn.disconnect()

    def call(self, request: bytes) -> Any:
        """Send *request* (one command, encoded) and return its reply, raising as redis-py;
        `BUSY` when it has no connection to spare."""
        held = self._take()
        if held is None:
            return BUSY
        conn = held.conn
        sent = False
        try:
            sock = conn._sock
            if sock is None or held.ready.poll(0):
                # Never connected, closed, or the server closed it meanwhile
                # (a restart, an idle timeout): connect again first, as the
                # pool does with a connection that has something to read.
                sock = held.connect()
            sock.sendall(request)
            sent = True
            data = sock.recv(_READ)
            if data[:1] == b":" and data.find(_CRLF) == len(data) - 2:
                reply: Any = int(data[1:-2])  # the usual reply: one integer, one read
            else:
                reply = _Reader(self, sock, data, conn).reply()
        except BaseException as e:
            # The connection may be mid-reply: never used again as it is.
            conn.disconnect()
            self._give(held)
            if isinstance(e, OSError):
                raise self._error(conn, e, sent) from e
            raise
        self._give(held)
        if isinstance(reply, Exception):
            raise reply
        return reply

    def _error(self, conn: Any, e: OSError, sent: bool) -> Exception:
        """redis-py's error for *e*: a connection lost or timed out, reading or writing."""
        if isinstance(e, _Closed):
            return self._connection_error("Connection closed by server.")
        # A kernel timeout (`_kernel_timeouts`) fails as EAGAIN: a BlockingIOError.
        timed_out = isinstance(e, (TimeoutError, BlockingIOError))
        if not sent:
            if timed_out:
                return self._timeout_error("Timeout writing to socket")
            return self._connection_error(f"Error {e.errno} while writing to socket. {e.strerror}.")
        host = conn._host_error()
        if timed_out:
            return self._timeout_error(f"Timeout reading from {host}")
        return self._connection_error(f"Error while reading from {host} : {e.args}")


#: `Wire.call`'s answer when it has no connection to spare: the caller takes redis-py's path.
BUSY: Any = object()
_wires: weakref.WeakSet[Wire] = weakref.WeakSet()


def _forget_all() -> None:
    for wire in list(_wires):
        wire._forget()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_all)


class _Conn:
    """A connection of a wire's own, and the poll telling whether the server closed it."""

    __slots__ = ("conn", "ready")

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.ready: Any = None

    def connect(self) -> Any:
        """Connect (again): redis-py's handshake (AUTH, SELECT, ...); the socket."""
        conn = self.conn
        conn.disconnect()
        conn.connect()
        sock = conn._sock
        _kernel_timeouts(sock)
        self.ready = select.poll()
        self.ready.register(sock, select.POLLIN)
        return sock


def _kernel_timeouts(sock: Any) -> None:
    """*sock*'s timeout kept by the kernel (``SO_RCVTIMEO``, ``SO_SNDTIMEO``), not by Python.

    Python polls before every send and receive on a socket with a timeout:
    two system calls of four per decision (about 1.4 us of CPU). A plain TCP
    or unix socket on Linux waits as long in the kernel instead, each send or
    receive as redis-py's would (a timed-out one fails with ``EAGAIN``); TLS
    sockets keep Python's timeout.
    """
    timeout = sock.gettimeout()
    if not timeout or type(sock) is not socket.socket or not sys.platform.startswith("linux"):
        return
    seconds = int(timeout)
    micros = max(
        math.ceil((timeout - seconds) * 1_000_000), 0 if seconds else 1
    )  # never 0: 0 waits forever
    value = struct.pack("@ll", seconds, micros)  # struct timeval
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
    except OSError:
        return  # Python's timeout stays
    sock.settimeout(None)


class _Closed(ConnectionError):
    """The server closed the connection before the whole reply came."""


class _Reader:
    """One RESP2 reply, from *data* on and then from the socket: the shapes scripts return
    (integer, bulk string, nil, array, status, error), errors parsed as redis-py does."""

    def __init__(self, wire: Wire, sock: Any, data: bytes, conn: Any) -> None:
        self._wire = wire
        self._sock = sock
        self._buf = data
        self._pos = 0
        self._conn = conn

    def reply(self) -> Any:
        if not self._buf:
            raise _Closed
        value = self._value()
        if self._pos != len(self._buf):
            raise self._invalid(f"{len(self._buf) - self._pos} bytes after the reply")
        return value

    def _more(self) -> None:
        data = self._sock.recv(_READ)
        if not data:
            raise _Closed
        self._buf = self._buf[self._pos :] + data
        self._pos = 0

    def _line(self) -> bytes:
        while True:
            end = self._buf.find(_CRLF, self._pos)
            if end >= 0:
                line = self._buf[self._pos : end]
                self._pos = end + 2
                return line
            self._more()

    def _invalid(self, what: str) -> Exception:
        invalid: Exception = self._wire._invalid(f"Protocol error: {what}")
        return invalid

    def _value(self) -> Any:
        line = self._line()
        kind, rest = line[:1], line[1:]
        try:
            if kind == b":":
                return int(rest)
            if kind == b"$":
                size = int(rest)
                if size < 0:
                    return None
                while len(self._buf) - self._pos < size + 2:
                    self._more()
                value = self._buf[self._pos : self._pos + size]
                self._pos += size + 2
                return value
            if kind == b"*":
                count = int(rest)
                return None if count < 0 else [self._value() for _ in range(count)]
        except ValueError:
            pass
        else:
            if kind == b"+":
                return rest
            if kind == b"-":
                return self._conn._parser.parse_error(rest.decode("utf-8", errors="replace"))
        raise self._invalid(f"unexpected reply {line[:32]!r}")


class WireScript:
    """A redis-py ``Script`` whose calls go through a `Wire` (``script(keys=, args=)``).

    Its arguments are encoded once per distinct tuple of them (a limiter
    sends the same few again and again); a ``NOSCRIPT`` reply, an argument of
    another type, or no connection to spare: the call goes through redis-py.
    """

    def __init__(self, wire: Wire, script: Any) -> None:
        self._wire = wire
        self._script = script
        self._cache: dict[tuple[int, Sequence[Any]], tuple[bytes, bytes]] = {}

    @property
    def sha(self) -> str:
        """The script's SHA1 (the redis-py ``Script``'s; set by a reload)."""
        sha: str = self._script.sha
        return sha

    @sha.setter
    def sha(self, sha: str) -> None:
        self._script.sha = sha
        self._cache.clear()

    @property
    def script(self) -> Any:
        """The script's text."""
        return self._script.script

    @property
    def registered_client(self) -> Any:
        """The client the redis-py ``Script`` was registered on (its other calls' client)."""
        return self._script.registered_client

    def __call__(self, keys: Sequence[bytes], args: tuple[Any, ...]) -> Any:
        shape = (len(keys), args)
        parts = self._cache.get(shape)
        if parts is None:
            parts = self._encode(len(keys), args)
            if parts is None:
                return self._script(keys=keys, args=args)
        head, tail = parts
        if len(keys) == 1:
            key = keys[0]
            request = b"%s$%d\r\n%s\r\n%s" % (head, len(key), key, tail)
        else:
            request = b"".join([head, *(b"$%d\r\n%s\r\n" % (len(k), k) for k in keys), tail])
        try:
            reply = self._wire.call(request)
        except self._wire._noscript:
            # Redis lost the script (a restart, SCRIPT FLUSH): nothing ran.
            return self._script(keys=keys, args=args)
        if reply is BUSY:
            return self._script(keys=keys, args=args)
        return reply

    def _encode(self, nkeys: int, args: tuple[Any, ...]) -> tuple[bytes, bytes] | None:
        """The request around the keys, for *args*; None for an argument not bytes or int."""
        encoded = []
        for arg in args:
            if isinstance(arg, bytes):
                encoded.append(arg)
            elif type(arg) is int:
                encoded.append(b"%d" % arg)
            else:
                return None
        sha = self._script.sha.encode()
        head = b"*%d\r\n$7\r\nEVALSHA\r\n$%d\r\n%s\r\n$%d\r\n%d\r\n" % (
            3 + nkeys + len(args),
            len(sha),
            sha,
            len(b"%d" % nkeys),
            nkeys,
        )
        tail = b"".join(b"$%d\r\n%s\r\n" % (len(a), a) for a in encoded)
        if len(self._cache) >= 256:  # explicit times: a new tuple each call
            self._cache.clear()
        self._cache[(nkeys, args)] = (head, tail)
        return head, tail
