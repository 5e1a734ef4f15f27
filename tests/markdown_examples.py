"""The ``python`` blocks of a Markdown file, each run as written (the README's, the docs').

A block runs alone, in a fresh namespace, so a reader can copy any one of
them. What a block cannot take as written is swapped for the test's own:
the Redis URL for the test server's, a shared-memory table's name for a
unique one (removed after the block).
"""

from __future__ import annotations

import os
import re
import sys
import types
import uuid
from pathlib import Path

import pytest

#: What the blocks write for a Redis server and a named table.
REDIS_URL = "redis://127.0.0.1:6379/0"
TABLE_NAME = '"myapp-limits"'


def python_blocks(path: Path) -> list[str]:
    """The code of every ```` ```python ```` block in *path*, in order."""
    return re.findall(r"```python\n(.*?)```", path.read_text(encoding="utf-8"), re.S)


def run_block(code: str, where: str, request: pytest.FixtureRequest) -> None:
    """Run *code* (a block found at *where*, such as ``README.md block 3``) as a module's body.

    A block that makes a shared-memory table needs the extension (skipped
    without it); one naming a Redis server asks for the ``redis_url`` fixture.
    """
    name = None
    if "SharedKeyedTokenBucket" in code:
        pytest.importorskip("nanobucket._core._shared_c")
        name = f"nanobucket-example-{uuid.uuid4().hex}"
        code = code.replace(TABLE_NAME, repr(name))
    if "redis://" in code:
        code = code.replace(REDIS_URL, request.getfixturevalue("redis_url"))
    module = re.sub(r"\W", "_", where)
    # A module in sys.modules, as a reader's file would be: frameworks (Litestar)
    # resolve a handler's annotations through its module.
    sys.modules[module] = namespace = types.ModuleType(module)
    try:
        exec(compile(code, where, "exec"), vars(namespace))
    finally:
        del sys.modules[module]
        if name is not None and os.path.exists(f"/dev/shm/{name}"):
            os.unlink(f"/dev/shm/{name}")
