"""The sync limiters' own wire (`nanobucket.redis._wire`): script calls past redis-py's
command layer, against real redis-server processes.

Which clients take it and which go through redis-py (a cluster client:
tests/test_redis_cluster.py); the connection settings
it keeps (password, db, unix socket); a script Redis lost (``SCRIPT FLUSH``);
a server restarted between calls, one that closes the connection mid-reply or
answers what no script returns (through a proxy in front of a real server
that mangles one reply); a forked child; the pool's size as a bound; close.
Every decision is checked by its exact numbers.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
import valkey

from nanobucket import redis as nbr
from nanobucket.redis import _wire

from redis_server import RedisServer, free_port, running_server, threads_within

S = 1_000_000_000
PHASE = 15.0


def _limiter(client: Any, **kwargs: Any) -> nbr.RedisTokenBucket:
    kwargs.setdefault("timeout", 2.0)
    kwargs.setdefault("prefix", "wire")
    return nbr.RedisTokenBucket(client, rate=10, capacity=5, **kwargs)


def _wire_of(limiter: nbr.RedisTokenBucket) -> _wire.Wire:
    wire = limiter._wire
    assert wire is not None
    return wire


def _open(limiter: nbr.RedisTokenBucket) -> int:
    """Connections the limiter's wire holds open."""
    return sum(c.conn._sock is not None for c in _wire_of(limiter)._free)


@pytest.fixture
def server() -> Iterator[RedisServer]:
    yield from running_server()


# -- who takes the wire ----------------------------------------------------------


def test_plain_client_decides_through_the_wire(redis_url: str) -> None:
    limiter = _limiter(nbr.client_from_url(redis_url, socket_timeout=2.0), prefix="wire-plain")
    assert isinstance(limiter._script, _wire.WireScript)
    limiter.reset("k")
    d = limiter.check_at("k", 0, cost=2)
    assert isinstance(limiter._script, _wire.WireScript)
    assert (d.allowed, d.remaining, d.retry_after_ns, d.reset_after_ns) == (True, 3, 0, 2 * S // 10)
    assert [limiter.allow_at("k", 0) for _ in range(4)] == [True, True, True, False]
    assert limiter.reserve("k", max_wait_ns=S, now=0) == S // 10 * 1
    assert limiter.refund_at("k", 0, cost=2) is True
    assert list(limiter.allow_many_at(["k", "j"], 0, cost=1)) == [1, 1]
    assert _wire_of(limiter)._made == 1  # one thread: one connection of its own
    limiter.close()


def test_valkey_client_decides_through_the_wire(redis_url: str) -> None:
    client: Any = valkey.Valkey.from_url(redis_url, socket_timeout=2.0)
    limiter = _limiter(client, prefix="wire-valkey")
    assert isinstance(limiter._script, _wire.WireScript)
    assert limiter.check_at("k", 0, cost=5).remaining == 0
    assert isinstance(limiter._script, _wire.WireScript)
    d = limiter.check_at("k", 0)
    assert (d.allowed, d.retry_after_ns) == (False, S // 10)
    limiter.close()
    client.close()


@pytest.mark.parametrize(
    "make",
    [
        lambda url: redis.Redis.from_url(url, protocol=3),
        lambda url: redis.Redis(
            connection_pool=redis.ConnectionPool.from_url(
                url, connection_class=type("Mine", (redis.Connection,), {})
            )
        ),
    ],
    ids=["resp3", "own-connection-class"],
)
def test_unusual_clients_go_through_redis_py(redis_url: str, make: Callable[[str], Any]) -> None:
    client = make(redis_url)
    limiter = _limiter(client, prefix="wire-unusual")
    assert limiter._wire is None
    assert not isinstance(limiter._script, _wire.WireScript)
    limiter.reset("k")
    assert limiter.check_at("k", 0, cost=5).remaining == 0
    assert limiter.check_at("k", 0).allowed is False
    limiter.close()
    client.close()


# -- connection settings kept ------------------------------------------------------


def test_password_and_db_are_the_clients(server: RedisServer) -> None:
    server.client().config_set("requirepass", "s3cret")
    client = redis.Redis(port=server.port, password="s3cret", db=3, socket_timeout=2.0)
    limiter = _limiter(client)
    assert limiter.check_at("k", 0, cost=3).remaining == 2
    assert _wire_of(limiter)._made == 1
    assert client.get(limiter.key("k")) is not None  # in db 3
    assert redis.Redis(port=server.port, password="s3cret", db=0).dbsize() == 0
    wrong = redis.Redis(port=server.port, password="wrong", socket_timeout=2.0)
    denied = _limiter(wrong, on_error="closed")
    d = denied.check("k")  # redis-py's AuthenticationError, a ConnectionError
    assert (d.allowed, d.source, d.reason) == (False, "policy:closed", "connection")
    limiter.close()
    denied.close()
    client.close()


def test_unix_socket(tmp_path: Any) -> None:
    path = str(tmp_path / "redis.sock")
    for _ in running_server("--unixsocket", path, "--unixsocketperm", "700"):
        client = redis.Redis(unix_socket_path=path, socket_timeout=2.0)
        limiter = _limiter(client)
        assert limiter._wire is not None
        assert [limiter.check_at("k", 0, cost=2).remaining for _ in range(3)] == [3, 1, 1]
        limiter.close()


def _self_signed(folder: Any) -> tuple[str, str]:
    """A certificate for 127.0.0.1 and its key (the openssl command), or skip."""
    openssl = shutil.which("openssl")
    if openssl is None:
        pytest.skip("no openssl command to make a certificate")
    cert, key = str(folder / "cert.pem"), str(folder / "key.pem")
    subprocess.run(
        [
            *(openssl, "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"),
            *("-keyout", key, "-out", cert),
        ],
        check=True,
        capture_output=True,
    )
    return cert, key


def test_tls(tmp_path: Any) -> None:
    cert, key = _self_signed(tmp_path)
    port = free_port()
    tls = ("--tls-port", str(port), "--tls-cert-file", cert, "--tls-key-file", key)
    for server in running_server(*tls, "--tls-ca-cert-file", cert, "--tls-auth-clients", "no"):
        client = redis.Redis("127.0.0.1", port, ssl=True, ssl_ca_certs=cert, socket_timeout=2.0)
        limiter = _limiter(client)
        assert _wire_of(limiter)._cls is redis.SSLConnection
        assert [limiter.check_at("k", 0, cost=2).remaining for _ in range(3)] == [3, 1, 1]
        # The server drops the connection: seen before the next call, over TLS too.
        server.client().client_kill_filter(_type="normal", skipme=True)
        d = limiter.check_at("k", 0, cost=1)
        assert (d.source, d.remaining) == ("redis", 0)
        limiter.close()
        client.close()


# -- Redis losing things -------------------------------------------------------------


def test_script_flush_loads_the_script_again_and_spends_once(server: RedisServer) -> None:
    client = server.client()
    limiter = _limiter(client)
    assert limiter.check_at("k", 0).remaining == 4
    assert limiter.reserve("k", now=0) == 0
    client.script_flush()
    # NOSCRIPT ran nothing: each call spends its token once, through redis-py.
    assert limiter.check_at("k", 0).remaining == 2
    client.script_flush()
    assert limiter.reserve("k", now=0) == 0
    assert limiter.check_at("k", 0).remaining == 0
    assert limiter.breaker.state == "closed"
    limiter.close()


def test_a_restarted_server_is_reconnected_before_the_call(server: RedisServer) -> None:
    limiter = _limiter(server.client(), on_error="closed")
    assert limiter.check_at("k", 0).remaining == 4
    server.stop()
    server.start()
    # The connection the server closed is seen closed before sending, as
    # redis-py's pool sees it: the decision is Redis's (the state went with it).
    d = limiter.check_at("k", 0)
    assert (d.source, d.remaining) == ("redis", 4)
    server.client().client_kill_filter(_type="normal", skipme=True)  # an idle timeout, say
    d = limiter.check_at("k", 0)
    assert (d.source, d.remaining) == ("redis", 3)
    limiter.close()


@pytest.mark.wall_clock
def test_a_paused_server_times_out_and_the_next_call_reconnects(server: RedisServer) -> None:
    limiter = _limiter(server.client(), on_error="open", timeout=0.2)
    assert limiter.check_at("k", 0).remaining == 4
    if sys.platform.startswith("linux"):  # the kernel keeps the timeout, not Python
        assert _wire_of(limiter)._free[0].conn._sock.gettimeout() is None
    server.pause()
    try:
        start = time.monotonic()
        d = limiter.check_at("k", 0)
        elapsed = time.monotonic() - start
    finally:
        server.resume()
    assert (d.allowed, d.source, d.reason) == (True, "policy:open", "timeout")
    assert 0.19 < elapsed < 0.2 + 0.4, elapsed
    limiter.breaker.record_success()  # no back-off to wait out
    assert limiter.check_at("k", 0).remaining in (3, 2)  # the late reply may have spent one
    limiter.close()


class _Proxy:
    """A TCP proxy in front of a real server, bytes pumped both ways; the reply to the next
    EVALSHA sent after `mangle` is set is replaced by its bytes (the connection closed
    after them when *close_after*). redis-py pipelines its handshake: no other reply is
    touched."""

    def __init__(self, port: int) -> None:
        self.upstream = port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.mangle: bytes | None = None
        self.close_after = False
        self._armed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            up = socket.create_connection(("127.0.0.1", self.upstream))
            threading.Thread(target=self._requests, args=(conn, up), daemon=True).start()
            threading.Thread(target=self._replies, args=(up, conn), daemon=True).start()

    def _requests(self, conn: socket.socket, up: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := conn.recv(65536):
                if b"EVALSHA" in data and self.mangle is not None:
                    self._armed.set()  # before the server can answer
                up.sendall(data)
        with contextlib.suppress(OSError):
            up.shutdown(socket.SHUT_WR)

    def _replies(self, up: socket.socket, conn: socket.socket) -> None:
        with conn, up, contextlib.suppress(OSError):
            while data := up.recv(65536):
                if self._armed.is_set() and self.mangle is not None:
                    data, self.mangle = self.mangle, None  # a script reply: one read
                    self._armed.clear()
                    conn.sendall(data)
                    if self.close_after:
                        # Now, though the other pump still reads from it.
                        conn.shutdown(socket.SHUT_RDWR)
                        return
                    continue
                conn.sendall(data)

    def close(self) -> None:
        self.listener.close()


@pytest.mark.parametrize(
    ("mangled", "close", "reason"),
    [
        (b":12", True, "connection"),  # the server closes the connection mid-reply
        (b"", True, "connection"),  # ... before any byte of it
        (b"$5\r\nab", True, "connection"),  # ... mid bulk string
        (b"%1\r\n:1\r\n:2\r\n", False, "error"),  # a RESP3 map: no script returns one
        (b"?what\r\n", False, "error"),  # not RESP at all
        (b":1\r\n:2\r\n", False, "error"),  # more than one reply
    ],
    ids=["mid-integer", "no-byte", "mid-bulk", "resp3-map", "garbage", "two-replies"],
)
def test_a_broken_reply_is_redis_unavailable_and_the_connection_replaced(
    server: RedisServer, mangled: bytes, close: bool, reason: str
) -> None:
    proxy = _Proxy(server.port)
    try:
        client = redis.Redis(port=proxy.port, socket_timeout=2.0)
        limiter = _limiter(client, on_error="closed")
        assert limiter.check_at("k", 0).remaining == 4
        proxy.mangle, proxy.close_after = mangled, close
        d = limiter.check_at("k", 0)
        assert (d.allowed, d.source, d.reason) == (False, "policy:closed", reason)
        assert limiter.breaker.state == "open"
        limiter.breaker.record_success()
        # The broken connection was dropped: a new one decides (the mangled
        # call ran in Redis: one token more spent).
        assert limiter.check_at("k", 0).remaining == 2
        assert _wire_of(limiter)._made == 1
        limiter.close()
    finally:
        proxy.close()


def test_an_error_reply_keeps_the_connection(server: RedisServer) -> None:
    client = server.client()
    limiter = _limiter(client, on_error="closed")
    client.set("filler", "1")
    client.config_set("maxmemory", "1")
    try:
        d = limiter.check_at("k", 0)
    finally:
        client.config_set("maxmemory", "0")
    assert (d.allowed, d.source, d.reason) == (False, "policy:closed", "oom")
    limiter.breaker.record_success()
    assert limiter.check_at("k", 0).remaining == 4
    assert _wire_of(limiter)._made == 1 and _open(limiter) == 1
    limiter.close()


# -- processes, threads, close ---------------------------------------------------------


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_makes_connections_of_its_own(server: RedisServer) -> None:
    limiter = _limiter(server.client())
    assert limiter.check_at("k", 0).remaining == 4
    pid = os.fork()
    if pid == 0:  # the child: its decisions on new connections, never the parent's
        ok = _wire_of(limiter)._free == [] and limiter.check_at("k", 0).remaining == 3
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert limiter.check_at("k", 0).remaining == 2  # the parent's connection is intact
    limiter.close()


def test_no_more_connections_than_the_pool_holds(server: RedisServer) -> None:
    blocking: Any = redis.BlockingConnectionPool
    pool = blocking(port=server.port, max_connections=2, socket_timeout=2.0)
    limiter = nbr.RedisTokenBucket(
        redis.Redis(connection_pool=pool), rate=1, capacity=400, prefix="wire", timeout=2.0
    )
    admitted = threads_within(8, lambda _: sum(limiter.allow_at("k", 0) for _ in range(60)), PHASE)
    assert sum(admitted) == 400
    assert _wire_of(limiter)._made <= 2
    limiter.close()


def test_close_closes_the_wires_connections(server: RedisServer) -> None:
    client = server.client()
    limiter = _limiter(client)
    limiter.check_at("k", 0)
    assert _open(limiter) == 1
    before = len(client.client_list())
    limiter.close()
    assert _open(limiter) == 0
    deadline = time.monotonic() + PHASE
    while len(client.client_list()) != before - 1:  # the server sees the close soon after
        assert time.monotonic() < deadline
        time.sleep(0.01)
    # Still usable, as a closed redis-py client is: through redis-py.
    assert limiter.check_at("k", 0).remaining == 3
