"""A server process on loopback for the tests and benchmarks: a free port, and the
process started, waited for until it listens, and stopped."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

#: How long a server may take to listen (s).
START_S = 30


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def listening(
    argv: list[str], port: int, said: Callable[[], str] = str, **popen: Any
) -> Iterator[str]:
    """``http://127.0.0.1:<port>`` while the process of *argv* runs and listens on *port*;
    stopped after. ``said()`` is what a failure to start quotes (its log); *popen* goes to
    `subprocess.Popen`."""
    proc = subprocess.Popen(argv, **popen)
    try:
        deadline = time.monotonic() + START_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"server exited:\n{said()}")
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"server did not start:\n{said()}") from None
                time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
