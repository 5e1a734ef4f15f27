"""Batches: ``allow_many_at`` decides as ``allow_at`` called on each key in turn, at one instant."""

from __future__ import annotations

import pytest

from .backends import BATCH, T0, Case, Subject, T

# Cost 2 of 5: alice pays twice, bob twice, carol once; the rest are refused.
KEYS = ["alice", "bob", "alice", "alice", "carol", "alice", "bob", "alice", "alice"]
ADMITTED = [1, 1, 1, 0, 1, 0, 1, 0, 0]


@pytest.mark.applies(BATCH)
def test_allow_many_equals_allow_called_in_turn(backend: Case) -> None:
    async def body(s: Subject) -> None:
        # The batch and the loop each on keys of their own, in one limiter.
        for now, keys, want in (
            (T0, KEYS, ADMITTED),
            (T0 + 3 * T, ["alice"] * 3, [1, 1, 0]),  # 1 + 3 refilled: two of cost 2
            (T0 + 3 * T, [], []),
        ):
            batch = await s.many([f"batch:{k}" for k in keys], now, 2)
            loop = [int(await s.allow(f"loop:{k}", now, 2)) for k in keys]
            assert isinstance(batch, bytearray)
            assert list(batch) == loop == want
        for k in ("alice", "bob", "carol"):
            assert await s.state(f"batch:{k}", T0 + 3 * T) == await s.state(f"loop:{k}", T0 + 3 * T)

    backend.run(body)


@pytest.mark.applies(BATCH)
def test_a_str_or_bytes_is_no_batch(backend: Case) -> None:
    async def body(s: Subject) -> None:
        for keys in ("alice", b"alice"):
            with pytest.raises(
                TypeError, match=r"^keys must be a sequence of keys, not a single str or bytes$"
            ):
                await s.many(keys, T0)
        assert await s.state("a", T0) == (True, 5, 0, 0, 5)

    backend.run(body)
