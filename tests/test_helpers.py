"""The test suite's own helpers, where a mistake would let a wrong result pass."""

from __future__ import annotations

from conftest import in_line


def test_in_line_takes_each_token_once_give_or_take_one_late_clock() -> None:
    assert in_line([2, 1, 0], 3)
    assert in_line([0, 2, 1], 3)  # any order
    assert in_line([2, 0, 0], 3)  # the second read the clock before the first landed
    assert in_line([1, 1, 0], 3)
    assert not in_line([2, 1], 3)  # one token short
    assert not in_line([2, 1, 0, 0], 3)  # one too many
    assert not in_line([3, 1, 0], 3)  # more than the bucket holds
    assert not in_line([2, 2, 0], 3)  # two with the same place: a token spent twice
    assert not in_line([2, 0, 0, 0], 4)  # two places behind
