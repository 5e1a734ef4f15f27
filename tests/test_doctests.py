"""The examples in the docstrings run as written (DESIGN: a two-line example per public name).

Every public name (a module's ``__all__``) and every public method of a
public class has an example that runs, and the README's API reference names
every public name.
"""

from __future__ import annotations

import doctest
import importlib
import inspect
import re
from pathlib import Path
from types import ModuleType

import pytest

MODULES = [
    "nanobucket",
    "nanobucket._bucket_py",
    "nanobucket.reference",
    "nanobucket.decorator",
    "nanobucket.layered",
    "nanobucket.waiting",
    "nanobucket.explain",
    "nanobucket.simulate",
    "nanobucket._http",
    "nanobucket.asgi",
    "nanobucket.wsgi",
    "nanobucket.redis",
]

# The public modules whose names (and the methods of their classes) must
# carry an example; names defined by the extensions are checked where they
# are defined (`_bucket_c`, `_shared_c`), so only their class docstrings here.
PUBLIC = [
    "nanobucket",
    "nanobucket.layered",
    "nanobucket.decorator",
    "nanobucket.waiting",
    "nanobucket.redis",
    "nanobucket.asgi",
    "nanobucket.wsgi",
    "nanobucket.shared",
    "nanobucket.reference",
    "nanobucket.explain",
    "nanobucket.simulate",
]
CORE = ("nanobucket._bucket_c", "nanobucket._bucket_py", "nanobucket._shared_c")

README = Path(__file__).resolve().parent.parent / "README.md"


def _doctest(module: ModuleType) -> doctest.TestResults:
    return doctest.testmod(module, optionflags=doctest.ELLIPSIS)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = _doctest(importlib.import_module(name))
    assert result.attempted > 0
    assert result.failed == 0


@pytest.mark.c_extension
@pytest.mark.parametrize("name", ["nanobucket._bucket_c", "nanobucket._floor"])
def test_docstring_examples_of_the_extensions(name: str) -> None:
    module = pytest.importorskip(name)
    result = _doctest(module)
    assert (result.attempted > 0, result.failed) == (True, 0)


@pytest.mark.c_extension
def test_docstring_examples_of_shared_memory() -> None:
    # The tables need the _shared_c extension (not built on Windows, nor on a
    # pure-Python install): there the examples cannot run.
    pytest.importorskip("nanobucket._shared_c")
    result = _doctest(importlib.import_module("nanobucket.shared"))
    assert (result.attempted > 0, result.failed) == (True, 0)


def _public_names(module: ModuleType) -> list[str]:
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    # No __all__ (reference.py): what the module itself defines.
    return [
        n
        for n, v in vars(module).items()
        if not n.startswith("_") and getattr(v, "__module__", None) == module.__name__
    ]


def _runs_an_example(obj: object) -> bool:
    doc = inspect.getdoc(obj) or ""
    examples = doctest.DocTestParser().get_examples(doc)
    return any(not e.options.get(doctest.SKIP, False) for e in examples)


def _members(cls: type) -> list[tuple[str, object]]:
    """Public methods and properties of *cls*, and of its private bases in the package.

    (The Redis limiters share a private base; a public base is checked under
    its own name, and the extensions' classes where they are defined.)
    """
    found: list[tuple[str, object]] = []
    for base in cls.__mro__:
        if not base.__module__.startswith("nanobucket.") or base.__module__ in CORE:
            continue
        if base is not cls and not base.__name__.startswith("_"):
            continue
        for attr, value in vars(base).items():
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__  # noqa: PLW2901 - the function carries the docstring
            if not attr.startswith("_") and (
                isinstance(value, property) or inspect.isfunction(value)
            ):
                found.append((attr, value))
    return found


def _documented_objects() -> list[tuple[str, object]]:
    found: list[tuple[str, object]] = []
    for modname in PUBLIC:
        module = importlib.import_module(modname)
        for name in _public_names(module):
            obj = getattr(module, name)
            if not callable(obj):
                continue  # a constant: no docstring of its own
            found.append((f"{modname}.{name}", obj))
            if inspect.isclass(obj) and obj.__module__ not in CORE:
                found += [(f"{modname}.{name}.{a}", m) for a, m in _members(obj)]
    return found


def test_every_public_name_has_an_example() -> None:
    missing = sorted({name for name, obj in _documented_objects() if not _runs_an_example(obj)})
    assert missing == []


def _api_reference() -> str:
    text = README.read_text(encoding="utf-8")
    start = text.index("## API reference")
    end = text.index("\n## ", start + 1)
    return text[start:end]


def test_the_readme_api_reference_names_every_public_name() -> None:
    section = _api_reference()
    quoted = " ".join(re.findall(r"`([^`]+)`", section))
    missing = []
    for modname in PUBLIC:
        for name in _public_names(importlib.import_module(modname)):
            if not re.search(rf"(?<!\w){re.escape(name)}(?!\w)", quoted):
                missing.append(f"{modname}.{name}")
    assert missing == []
