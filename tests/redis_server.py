"""A real redis-server for the tests: found on PATH, started on a free loopback port.

No persistence (``--save ''``, no AOF), its own temp dir, stopped at the end.
When no binary can be found the tests that need it skip with the reason,
except under ``CI`` (any non-empty value), where they fail: CI installs
``redis-server`` first, so a missing one there is a broken setup.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from nanobucket import redis as nbr

SEARCH = ("/usr/bin", "/usr/local/bin", "/usr/sbin", "/opt/homebrew/bin")
START_TIMEOUT = 10.0
CLUSTER_START_ATTEMPTS = 3  # a cluster that does not form is built again


def find_redis_server() -> str | None:
    """Path of a redis-server binary (``$REDIS_SERVER``, PATH, usual places), or None."""
    explicit = os.environ.get("REDIS_SERVER")
    if explicit:
        return explicit if os.access(explicit, os.X_OK) else None
    found = shutil.which("redis-server")
    if found:
        return found
    for folder in SEARCH:
        path = os.path.join(folder, "redis-server")
        if os.access(path, os.X_OK):
            return path
    return None


def _port_is_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
        return True


def free_port(cluster_bus: bool = False) -> int:
    """A TCP port free on 127.0.0.1 right now (with *cluster_bus*, port + 10000 too)."""
    while True:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if not cluster_bus:
            return port
        if port + 10000 <= 65535 and _port_is_free(port + 10000):
            return port
        port = random.randint(1024, 55535)  # ephemeral ports are often above 55535
        if _port_is_free(port) and _port_is_free(port + 10000):
            return port


class RedisServer:
    """One redis-server process on 127.0.0.1; ``stop``/``start`` keep the port.

    *args* are extra command-line options (``["--cluster-enabled", "yes"]``).
    """

    def __init__(self, binary: str, args: tuple[str, ...] = ()) -> None:
        self.binary = binary
        self.args = tuple(args)
        self.port = free_port(cluster_bus="--cluster-enabled" in self.args)
        self._dir = tempfile.TemporaryDirectory(prefix="nanobucket-redis-")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self, wait: bool = True) -> None:
        """Start the server and (unless not *wait*) wait until it answers PING."""
        assert self.proc is None, "already running"
        self.proc = subprocess.Popen(
            [
                self.binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                self._dir.name,
                "--daemonize",
                "no",
                "--loglevel",
                "warning",
                *self.args,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        if not wait:
            return
        client = redis.Redis(
            host="127.0.0.1", port=self.port, socket_timeout=0.5, socket_connect_timeout=0.5
        )
        deadline = time.monotonic() + START_TIMEOUT
        try:
            while True:
                if self.proc.poll() is not None:
                    err = (
                        self.proc.stderr.read().decode(errors="replace") if self.proc.stderr else ""
                    )
                    self.proc = None
                    raise RuntimeError(f"redis-server exited at start: {err.strip()}")
                try:
                    if client.ping():
                        return
                except redis.ConnectionError:
                    pass
                if time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"redis-server did not answer PING in {START_TIMEOUT} s")
                time.sleep(0.02)
        finally:
            client.close()

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL after 5 s)."""
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGCONT)  # a paused server cannot handle SIGTERM
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stderr:
            proc.stderr.close()

    def pause(self) -> None:
        """Freeze the server (SIGSTOP): connections stay open, replies never come."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Undo `pause`."""
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGCONT)

    def client(self) -> redis.Redis:
        """A client with 2 s timeouts and no retries, for setting the server up."""
        return redis.Redis(
            host="127.0.0.1",
            port=self.port,
            socket_timeout=2.0,
            socket_connect_timeout=2.0,
            retry=Retry(NoBackoff(), 0),
        )

    def close(self) -> None:
        self.stop()
        self._dir.cleanup()


class RedisClusterServers:
    """Three (*masters*) cluster-enabled redis-servers joined by ``redis-cli --cluster create``.

    No replicas: a master that dies takes its slots with it. *args* go to
    every node (``--cluster-node-timeout`` decides how soon the others see
    a lost master and the cluster answers ``CLUSTERDOWN``).
    """

    def __init__(self, binary: str, masters: int = 3, args: tuple[str, ...] = ()) -> None:
        self.binary = binary
        self.nodes: list[RedisServer] = []
        ports: set[int] = set()
        while len(self.nodes) < masters:
            node = RedisServer(binary, ("--cluster-enabled", "yes", *args))
            if node.port in ports or node.port + 10000 in ports:
                node.close()
                continue
            ports.update((node.port, node.port + 10000))
            self.nodes.append(node)

    @property
    def ports(self) -> list[int]:
        return [node.port for node in self.nodes]

    def start(self) -> None:
        """Start the nodes, make them one cluster, wait until every node says ``ok``."""
        for node in self.nodes:
            node.start()
        cli = os.path.join(os.path.dirname(self.binary), "redis-cli")
        if not os.access(cli, os.X_OK):
            cli = shutil.which("redis-cli") or "redis-cli"
        addresses = [f"127.0.0.1:{port}" for port in self.ports]
        subprocess.run(
            [cli, "--cluster", "create", *addresses, "--cluster-replicas", "0", "--cluster-yes"],
            check=True,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            timeout=START_TIMEOUT,
        )
        deadline = time.monotonic() + START_TIMEOUT
        admins: list[Any] = [node.client() for node in self.nodes]
        try:
            for admin in admins:
                while True:
                    info = admin.execute_command("CLUSTER", "INFO")
                    if b"cluster_state:ok" in info and (
                        f"cluster_known_nodes:{len(self.nodes)}".encode() in info
                    ):
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"the cluster was not ok in {START_TIMEOUT} s: {info!r}")
                    time.sleep(0.02)
        finally:
            for admin in admins:
                admin.close()

    def node_of(self, key: bytes) -> RedisServer:
        """The node that serves *key*'s hash slot (asked of the servers themselves)."""
        admin: Any
        with contextlib.closing(self.nodes[0].client()) as admin:
            slot = int(admin.execute_command("CLUSTER", "KEYSLOT", key))
            for start, end, owner, *_ in admin.execute_command("CLUSTER", "SLOTS"):
                if start <= slot <= end:
                    port = int(owner[1])
                    return next(node for node in self.nodes if node.port == port)
        raise AssertionError(f"no node serves slot {slot}")

    def close(self) -> None:
        for node in self.nodes:
            node.close()


def require_redis_server() -> str:
    """The redis-server binary, or skip (fail under CI) with the reason."""
    binary = find_redis_server()
    if binary is None:
        reason = (
            "no redis-server binary (PATH, /usr/bin, /usr/local/bin, $REDIS_SERVER): "
            "install it, e.g. apt-get install redis-server"
        )
        if os.environ.get("CI"):
            pytest.fail(reason + " -- CI must run the Redis tests", pytrace=False)
        pytest.skip(reason)
    return binary


def running_server(*args: str) -> Iterator[RedisServer]:
    """A started server (with extra options *args*), stopped and cleaned up afterwards."""
    server = RedisServer(require_redis_server(), args)
    server.start()
    try:
        yield server
    finally:
        server.close()


def running_cluster(*args: str) -> Iterator[RedisClusterServers]:
    """A started 3-master cluster (nodes get *args*), stopped and cleaned up afterwards."""
    binary = require_redis_server()
    for attempt in range(CLUSTER_START_ATTEMPTS):
        cluster = RedisClusterServers(binary, args=args)
        try:
            cluster.start()
            break
        except (subprocess.SubprocessError, RuntimeError):
            # `redis-cli --cluster create` waits without end for a node whose
            # bus port another process took between the check and the start
            # (seen once in a loaded CI run): new nodes on new ports.
            cluster.close()
            if attempt == CLUSTER_START_ATTEMPTS - 1:
                raise
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="session")
def redis_session_server() -> Iterator[RedisServer]:
    """One redis-server for the whole session (tests must not stop it)."""
    yield from running_server()


@pytest.fixture(scope="session")
def redis_url(redis_session_server: RedisServer) -> str:
    """URL of the session's redis-server on 127.0.0.1."""
    return redis_session_server.url


@pytest.fixture
def own_redis_server() -> Iterator[RedisServer]:
    """A redis-server of the test's own, which the test may stop, pause and restart."""
    yield from running_server()


@pytest.fixture
def busy_server() -> Iterator[RedisServer]:
    """A server whose scripts count as busy after 20 ms (the default is 5 s)."""
    yield from running_server("--lua-time-limit", "20")


def threads_within(count: int, target: Callable[[int], Any], phase: float) -> list[Any]:
    """``target(i)`` in *count* threads released together; their results.

    Bounded: a thread still running *phase* seconds on (a call stuck on a
    hung Redis) fails the test instead of hanging it; the threads are daemons.
    """
    results: list[Any] = [None] * count
    errors: list[BaseException] = []
    barrier = threading.Barrier(count)

    def run(i: int) -> None:
        try:
            barrier.wait(phase)
            results[i] = target(i)
        except BaseException as exc:  # re-raised below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(count)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + phase
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    stuck = sum(t.is_alive() for t in threads)
    assert not stuck, f"{stuck} of {count} threads still running after {phase} s"
    if errors:
        raise errors[0]
    return results


def leased(url: str, prefix: str, lease: int) -> tuple[Any, nbr.LeasedTokenBucket]:
    """A client and a `LeasedTokenBucket` (100/s, capacity 100) taking leases of *lease*."""
    client = nbr.client_from_url(url, socket_timeout=2.0)
    limiter = nbr.LeasedTokenBucket(
        client,
        rate=100,
        capacity=100,
        prefix=prefix,
        min_lease=lease,
        max_lease=lease,
        timeout=2.0,
    )
    return client, limiter
