"""``allow_many``: a list of str keys, and int keys in a uint64 buffer.

Tests are generated per case (``test_allow_many_u64__nanobucket_c_array_Q``,
...). A buffer case skips, with the reason, if ``allow_many`` rejects it.
"""

from nanobucket.bench.cases import pytest_functions

globals().update(pytest_functions("allow_many_str"))
globals().update(pytest_functions("allow_many_u64"))
