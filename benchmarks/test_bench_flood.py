"""Hash flooding: new keys aimed at one slot beside random keys of the same type.

Tests are generated per case (``test_aimed__int__aimed``, ...); see
`nanobucket.bench.cases.aimed_cases` for what each calls.
"""

from nanobucket.bench.cases import pytest_functions

globals().update(pytest_functions("aimed"))
