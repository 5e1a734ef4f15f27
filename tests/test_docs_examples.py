"""The docs' Python examples run as written (Redis ones against a test server).

Every ```` ```python ```` block of ``docs/**/*.md``, each alone, as
`tests/test_readme.py` runs the README's; a fragment that cannot run alone
(a command, a config file of another language) is a ``console`` or
``toml`` block, never a ``python`` one. Another library's code, shown beside
ours on the migration pages, is a ```` ```py ```` block: highlighted as
Python, never run (that library is not installed).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from markdown_examples import python_blocks, run_block

# The web guide runs a Litestar app in this process, and Litestar leaves its logging
# listener thread running: a collection in that thread traversing a C table while a
# later test's insertion has let the GIL go (it can under Cython line tracing) crashed
# a coverage run. Every other stage runs these examples.
pytestmark = pytest.mark.gil_atomic

DOCS = Path(__file__).resolve().parent.parent / "docs"
EXAMPLES = [
    pytest.param(page, index, code, id=f"{page.relative_to(DOCS).as_posix()}:{index}")
    for page in sorted(DOCS.rglob("*.md"))
    for index, code in enumerate(python_blocks(page))
]


def test_the_docs_have_examples() -> None:
    assert DOCS.is_dir(), f"{DOCS} is missing: run the tests from a checkout (or copy docs/ too)"
    assert len(EXAMPLES) >= 20


@pytest.mark.parametrize(("page", "index", "code"), EXAMPLES)
def test_docs_example_runs(
    page: Path, index: int, code: str, request: pytest.FixtureRequest
) -> None:
    run_block(code, f"docs/{page.relative_to(DOCS).as_posix()} block {index}", request)


def test_each_migration_page_shows_their_code_beside_ours() -> None:
    """A migration page sets the other library's code (a ``py`` block, not run) beside ours."""
    pages = sorted((DOCS / "migrating").glob("*.md"))
    assert [p.stem for p in pages] == ["aiolimiter", "django-ratelimit", "flask-limiter", "slowapi"]
    for page in pages:
        text = page.read_text(encoding="utf-8")
        assert "```py\n" in text, page.name
        assert python_blocks(page), page.name
