"""Calling a limited API: pacing each key by the limits its server announces.

What it holds: the pacer (``pacer.py``: one bucket per key, followed as answers arrive), the
reading of an answer's fields (``fields.py``), the refill learned from answers that announce
none (``learn.py``), several processes pacing as one client (``shared.py``), the budgets an
API announces at once, requests and tokens (``budget_fields.py`` reads them, ``budgets.py``
keeps them, ``shared_budgets.py`` shares them between processes), and what the httpx and
requests adapters share (``adapter.py``).

What it may import: ``nanobucket._core`` and ``nanobucket._compose``.
"""
