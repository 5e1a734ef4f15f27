"""Hash flooding: new keys aimed at one slot beside random keys of the same type.

Tests are generated per case (``test_aimed__int__aimed``, ...); see
`nanobucket._bench_cases.aimed_cases` for what each calls.
"""

from nanobucket._bench_cases import pytest_functions

globals().update(pytest_functions("aimed"))
