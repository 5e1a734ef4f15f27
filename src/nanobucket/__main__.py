"""``python -m nanobucket`` and the ``nanobucket`` console script."""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ("main",)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``nanobucket`` command; return its exit status (see `nanobucket.cli`)."""
    from .cli import main as cli_main  # keeps `import nanobucket.__main__` cheap

    return cli_main(argv)


if __name__ == "__main__":
    sys.exit(main())
