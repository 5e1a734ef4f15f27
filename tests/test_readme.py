"""The README's Python examples run as written (Redis ones against a test server)."""

from __future__ import annotations

import os
import re
import uuid
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(encoding="utf-8"), re.S)


def test_the_readme_has_examples() -> None:
    assert len(BLOCKS) >= 8


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index: int, request: pytest.FixtureRequest) -> None:
    code = BLOCKS[index]
    if "SharedKeyedTokenBucket" in code:
        pytest.importorskip("nanobucket._shared_c")
        name = f"nanobucket-readme-{uuid.uuid4().hex}"
        code = code.replace('"myapp-limits"', repr(name))
    if "redis://" in code:
        url = request.getfixturevalue("redis_url")
        code = code.replace("redis://127.0.0.1:6379/0", url)
    namespace: dict[str, object] = {"__name__": f"readme_{index}"}
    try:
        exec(compile(code, f"README.md block {index}", "exec"), namespace)
    finally:
        if "SharedKeyedTokenBucket" in code and os.path.exists(f"/dev/shm/{name}"):
            os.unlink(f"/dev/shm/{name}")


from redis_server import redis_session_server, redis_url  # noqa: E402,F401  (fixtures for the Redis example)
