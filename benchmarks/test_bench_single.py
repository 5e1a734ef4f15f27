"""One bucket: ``allow()`` admitting, ``allow()`` rejecting, ``check()``.

Tests are generated per case (``test_allow_allowing__nanobucket_c``, ...);
see `nanobucket.bench.cases.single_cases` for what each one calls.
"""

from nanobucket.bench.cases import pytest_functions

globals().update(pytest_functions("allow_allowing"))
globals().update(pytest_functions("allow_rejecting"))
globals().update(pytest_functions("check"))
