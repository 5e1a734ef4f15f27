"""A real pre-fork server: gunicorn, 4 sync workers, one shared limit.

Each test runs twice: with an anonymous table the master creates and the
workers inherit (the README's recipe), and with a table named by path that
each worker opens.
"""

from __future__ import annotations

import http.client
import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from conftest import NEEDS_SHARED_TABLE, in_line

pytestmark = NEEDS_SHARED_TABLE

APPS = Path(__file__).parent / "apps"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def get(port: int, path: str) -> tuple[int, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        resp.read()
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}
    finally:
        conn.close()


CONFS = {"anonymous": "shared_anon_gunicorn_conf.py", "named": "shared_gunicorn_conf.py"}


@pytest.fixture(params=sorted(CONFS))
def server(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    kind = request.param
    table = tmp_path / "limits"
    port = free_port()
    env = {k: v for k, v in os.environ.items() if k != "NB_SHARED_TABLE"}
    if kind == "named":
        env["NB_SHARED_TABLE"] = str(table)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gunicorn",
            "-c",
            str(APPS / CONFS[kind]),
            # On the path, not the working directory: the traced build's code
            # names its .pyx relative to the repository (.ci/coverage.sh), and a
            # worker that changed directory would report it under no plugin.
            "--pythonpath",
            str(APPS),
            # A worker forked just before the SIGTERM of the teardown may miss it
            # (it still has the master's handler until it sets its own) and would
            # run out gunicorn's default 30 s grace, past the 20 s waited below:
            # after 5 s the master kills it and exits as usual.
            "--graceful-timeout",
            "5",
            "-b",
            f"127.0.0.1:{port}",
            "shared_wsgi_app:app",
        ],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    try:
        wait_until_up(proc, port)
        yield kind, port, table, proc.pid
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:  # pragma: no cover
            proc.kill()
            proc.wait()
        if proc.stderr:
            proc.stderr.close()
    assert proc.returncode == 0
    assert not table.exists()  # on_exit removed the named one
    assert list(tmp_path.iterdir()) == []


def wait_until_up(proc: subprocess.Popen[bytes], port: int, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if get(port, "/_health")[0] == 200:
                return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            err = proc.stderr.read().decode() if proc.stderr else ""
            pytest.fail(f"gunicorn did not start:\n{err[-2000:]}")
        time.sleep(0.1)


def test_four_gunicorn_workers_admit_exactly_capacity_per_key(server) -> None:  # type: ignore[no-untyped-def]
    kind, port, table, master = server
    assert table.exists() == (kind == "named")
    # 120 requests for alice and 30 for bob, 8 at a time. The bucket holds 50
    # and refills one token an hour, so whatever the timing and whichever
    # worker serves each request, alice gets exactly 50 and bob all 30. With
    # a bucket per worker alice could get up to 4 * 50 = 200.
    paths = ["/alice"] * 120 + ["/bob"] * 30
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda p: (p, *get(port, p)), paths))
    statuses = Counter((p, status) for p, status, _ in results)
    assert statuses == {("/alice", 200): 50, ("/alice", 429): 70, ("/bob", 200): 30}
    # Each admitted request took its own token: remaining counts 49 down to 0
    # (one lower where a worker read the clock just before another's
    # admission landed, see `in_line`).
    remaining = [int(h["ratelimit-remaining"]) for p, s, h in results if p == "/alice" and s == 200]
    assert in_line(remaining, 50)
    # The next token is an hour away (less the few seconds the test took).
    waits = {int(h["retry-after"]) for _, s, h in results if s == 429}
    assert waits <= set(range(3590, 3601)) and waits
    workers = {h["x-worker"] for _, _, h in results}
    assert len(workers) >= 2  # the limit really was shared between processes
    assert {h["x-table"] for _, _, h in results} == {kind}
    if kind == "anonymous" and sys.platform.startswith("linux"):
        # One sealed memfd, made in the master, mapped by every worker.
        for pid in [master, *map(int, workers)]:
            assert "/memfd:nanobucket (deleted)" in Path(f"/proc/{pid}/maps").read_text()


def workers_of(master: int) -> set[int]:
    """The pids of the master's children (Linux /proc)."""
    found = set()
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:  # gone meanwhile
                continue
            if int(stat.rpartition(")")[2].split()[1]) == master:
                found.add(int(entry))
    return found


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="finds the workers in /proc")
@pytest.mark.parametrize("how", ["kill", "reload"])
def test_workers_forked_to_replace_old_ones_keep_the_limit(server, how: str) -> None:  # type: ignore[no-untyped-def]
    _kind, port, _table, master = server
    statuses = Counter(get(port, "/carol")[0] for _ in range(60))
    assert statuses == {200: 50, 429: 10}
    old = workers_of(master)
    assert len(old) == 4
    if how == "kill":  # workers dying: the master forks new ones
        for pid in old:
            os.kill(pid, signal.SIGKILL)
    else:  # a reload: the config runs again, new workers, the old ones stop
        os.kill(master, signal.SIGHUP)
    # Every answer, from old workers still stopping or from new ones, comes
    # from the same table: carol's bucket is still empty.
    deadline = time.monotonic() + 30
    fresh: list[int] = []
    while len(fresh) < 20:
        assert time.monotonic() < deadline, "no new worker answered"
        try:
            status, headers = get(port, "/carol")
        except OSError:  # between workers
            time.sleep(0.05)
            continue
        assert status == 429
        if int(headers["x-worker"]) not in old:
            fresh.append(status)
    assert {get(port, "/dave")[0] for _ in range(3)} == {200}  # and new keys still get in
