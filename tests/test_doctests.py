"""The examples in the docstrings run as written (DESIGN: a two-line example per public name)."""

from __future__ import annotations

import doctest
import importlib

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
]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name: str) -> None:
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0
    assert result.failed == 0


@pytest.mark.c_extension
@pytest.mark.parametrize("name", ["nanobucket._bucket_c", "nanobucket._floor"])
def test_docstring_examples_of_the_extensions(name: str) -> None:
    module = pytest.importorskip(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
    assert (result.attempted > 0, result.failed) == (True, 0)
