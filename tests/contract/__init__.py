"""The contract suite: every limiter, every property, written once.

Each property is one test in this package, run on every backend it applies
to. The backends are the entries of `backends.BACKENDS`; each builds its
limiter with the same rate (10/s) and capacity (5), and every test decides at
explicit times (``*_at``, ``reserve(..., now=)``), so each expected number is
exact on every backend.

How a new backend joins: one more ``Backend(...)`` in `backends._backends`:

    Backend(
        "my-table",               # the test id
        MEMORY,                   # its family, where documented behaviour differs
        _in_process(lambda: MyTable(RATE, CAPACITY, clock=frozen_clock)),
        _TABLE - {RESET},         # the features it has: the properties that apply
        _KEYED_PROTOCOLS,         # the protocols it offers (test_protocols checks them)
    )

An asyncio limiter gives ``asyncio=True`` (its verbs are awaited, and it is
built inside the test's event loop); one that needs Redis gives
``needs_redis=True`` and reads the server from its `Env`. A property it
fails today goes in `conftest.KNOWN` with the reason, as a strict expected
failure, until the limiter is fixed.
"""
