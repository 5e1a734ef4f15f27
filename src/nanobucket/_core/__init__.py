"""The decision: one token bucket per key, in Cython and in its typed pure-Python twin.

What it holds: the GCRA rule (``_gcra.pxd`` for Cython, ``_gcra_py.py`` for the twin), the
C tables (``_bucket_c.pyx`` with its ``.pxi``: `TokenBucket`, `KeyedTokenBucket`, and
``all_of``'s C fast path; ``_shared_c.pyx``: the table in shared memory), the twin
(``_bucket_py.py``, ``_decision_py.py``), the selector between them (``_bucket.py``), the
parameters every limiter validates (``_params.py``), the contract every wrapper reads
(``_limiter.py``: the Protocols), and what a bucket's ``acquire`` waits in (``_acquire.py``,
``_wait.py``).

What it may import: nothing of the package outside this folder.
"""
