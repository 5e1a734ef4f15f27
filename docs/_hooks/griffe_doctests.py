"""A griffe extension: the docstrings' examples as highlighted code in the reference.

The docstrings are written for ``help()`` and doctest: ``>>>`` examples and
reST literal blocks (a paragraph ending ``::``, then an indented block). In
Markdown the first would read as nested block quotes and the second as
unhighlighted text, so each becomes a fenced block before mkdocstrings
renders it; a reST role (``:class:`RedisDecision```) becomes the code it
names. The docstrings themselves stay as they are.

A class whose ``__slots__`` is a dict documents its fields there (as
``help()`` shows them); those docstrings are given to the fields.
"""

from __future__ import annotations

import ast
import inspect
import re
from typing import Any

import griffe

_PROMPT = re.compile(r"^(\s*)>>> ")
_ROLE = re.compile(r":(?:py:)?(?:class|func|meth|mod|attr|data|exc|obj):`~?([^`]+)`")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def fence_examples(text: str) -> str:
    """*text* with each doctest run and each ``::`` literal block fenced."""
    lines = _ROLE.sub(r"`\1`", text).split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        prompt = _PROMPT.match(line)
        if prompt:  # a doctest run: up to the next blank line
            pad = prompt.group(1)
            out.append(f"{pad}```pycon")
            while i < len(lines) and lines[i].strip():
                out.append(lines[i])
                i += 1
            out.append(f"{pad}```")
            continue
        if line.rstrip().endswith("::") and i + 2 < len(lines) and not lines[i + 1].strip():
            body_start = i + 2
            base = _indent(line)
            if lines[body_start].strip() and _indent(lines[body_start]) > base:
                head = line.rstrip()[:-2].rstrip()
                out.append(head + ":" if head.strip() else "")
                out.append("")
                out.append(" " * base + "```python")
                j = body_start
                block: list[str] = []
                while j < len(lines) and (not lines[j].strip() or _indent(lines[j]) > base):
                    block.append(lines[j])
                    j += 1
                while block and not block[-1].strip():
                    block.pop()
                deepest = min(_indent(b) for b in block if b.strip())
                out += [" " * base + b[deepest:] if b.strip() else "" for b in block]
                out.append(" " * base + "```")
                out.append("")
                i = j
                continue
        out.append(line)
        i += 1
    return "\n".join(out)


class DoctestBlocks(griffe.Extension):
    """Fence every docstring's examples (see `fence_examples`)."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fence_examples(obj.docstring.value)

    def on_class_members(
        self, *, node: ast.AST | griffe.ObjectNode, cls: griffe.Class, **kwargs: Any
    ) -> None:
        if not isinstance(node, ast.ClassDef):
            return
        for statement in node.body:
            if not (
                isinstance(statement, ast.Assign)
                and [getattr(t, "id", None) for t in statement.targets] == ["__slots__"]
                and isinstance(statement.value, ast.Dict)
            ):
                continue
            for key, value in zip(statement.value.keys, statement.value.values):
                if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                    continue
                member = cls.members.get(key.value)
                if (
                    isinstance(member, griffe.Attribute)
                    and isinstance(value, ast.Constant)
                    and isinstance(value.value, str)
                ):
                    text = fence_examples(inspect.cleandoc(value.value))
                    member.docstring = griffe.Docstring(text, parent=member)
                    member.value = None  # what __init__ assigns, not a default
