"""Keyed tables: ``allow(key)`` over 100k and 1M keys (also shuffled), first touch, eviction.

Tests are generated per case (``test_keyed_small__dict_get``, ...); see
`nanobucket.bench.cases.keyed_cases` and neighbours for what each calls.
"""

from nanobucket.bench.cases import pytest_functions

globals().update(pytest_functions("keyed_small"))
globals().update(pytest_functions("keyed_large"))
globals().update(pytest_functions("keyed_shuffled"))
globals().update(pytest_functions("first_touch"))
globals().update(pytest_functions("eviction"))
