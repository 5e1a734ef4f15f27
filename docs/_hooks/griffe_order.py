"""A griffe extension: a reference page opens with the names a reader came for.

mkdocstrings orders a module's members as they appear in its source
(``members_order: source``), and a public module imports its helpers
(``Route``, ``Counters``, the key functions) before it defines its own class:
so ``nanobucket.asgi``'s page would open with ``Counters`` and end with
``RateLimitMiddleware``. ``__all__`` cannot say otherwise (ruff keeps it
sorted). This extension moves the names given for a module, in the order
given, before everything else; the rest keep their source order.

In ``mkdocs.yml``::

    extensions:
      - docs/_hooks/griffe_order.py:MainFirst:
          first:
            nanobucket.asgi: [RateLimitMiddleware]
"""

from __future__ import annotations

from typing import Any

import griffe


class MainFirst(griffe.Extension):
    """Put each module's named members first (see the module docstring)."""

    def __init__(self, first: dict[str, list[str]]) -> None:
        super().__init__()
        self.first = first

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        for path, names in self.first.items():
            if path != pkg.path and not path.startswith(pkg.path + "."):
                continue
            module = pkg if path == pkg.path else pkg[path[len(pkg.path) + 1 :]]
            for rank, name in enumerate(names):
                if name not in module.members:
                    raise ValueError(f"griffe_order: {path} has no member {name!r} to put first")
                member = module.members[name]
                # Sorting by source reads an alias's import line, else the definition's.
                place = rank - len(names)
                if member.is_alias:
                    member.alias_lineno = place
                else:
                    member.lineno = place
