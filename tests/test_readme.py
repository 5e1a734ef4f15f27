"""The README's Python examples run as written (Redis ones against a test server)."""

from __future__ import annotations

from pathlib import Path

import pytest

from markdown_examples import python_blocks, run_block

README = Path(__file__).resolve().parent.parent / "README.md"
BLOCKS = python_blocks(README)


def test_the_readme_has_examples() -> None:
    assert len(BLOCKS) >= 1  # the tour; the other examples live in docs/ (test_docs_examples)


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_example_runs(index: int, request: pytest.FixtureRequest) -> None:
    run_block(BLOCKS[index], f"README.md block {index}", request)
