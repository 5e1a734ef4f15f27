"""Limiters made of limiters, built on the contract alone (``nanobucket._core._limiter``).

What it holds: ``all_of`` (``layered.py``), ``tiered`` (with ``carry.py``: a key moved between
plans), `OneKey`, `Waiting` and `LeakyBucket`, the in-flight limits (``concurrency.py``), the
executor, ``@limit``, ``paced``, the penalty box, the hooks' `LimitEvent`, the verbs derived
once from a few steps (``verbs.py``) and the logic written once for threads and asyncio
(``drive.py``). The public modules of the same names re-export them (``penalty.py`` also
makes a limiter's tables of its kind: shared memory, Redis).

What it may import: ``nanobucket._core``.
"""
