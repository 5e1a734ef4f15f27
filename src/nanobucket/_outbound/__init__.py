"""Calling a limited API: pacing each key by the limits its server announces.

What it holds: the pacer (``pacer.py``: one bucket per key, followed as answers arrive), the
reading of an answer's fields (``fields.py``), the refill learned from answers that announce
none (``learn.py``), several processes pacing as one client (``shared.py``), the budgets an
API announces at once, requests and tokens (``budget_fields.py`` reads them, ``budgets.py``
keeps them, ``shared_budgets.py`` shares them between processes), and the flow that the
httpx and requests adapters share (``adapter.py``).

One flow for every request of every outbound adapter (the budgets read, learn from
and settle an answer on its way back, before the bucket's pacer reads it):

1. **request -> key**: the adapter's key function (``host_key``: the URL's host and
   port) names the key; the adapters' own modules (`nanobucket.httpx`,
   `nanobucket.requests`) read the request through the client's public API only.
2. **pace in every budget**: the key's bucket gives the request a token or a place
   in line (``pacer.py``; with ``shared=``, its slot in the processes' bucket,
   ``shared.py``); then the budgets the key's server announced (requests, tokens,
   input and output tokens) charge it its estimate, or it waits for room
   (``budgets.py``; with ``shared=``, the processes' slots in each,
   ``shared_budgets.py``).
3. **send**: the wrapped transport or adapter sends it.
4. **read the answer's fields**: the adapter finds the limit fields among the
   answer's names in one pass (``limit_fields``), and most answers have none;
   ``fields.py`` parses ``RateLimit-Policy`` / ``RateLimit``, ``X-RateLimit-*`` and
   ``Retry-After``, ``budget_fields.py`` the budgets' families.
5. **learn**: the pacer follows what the fields say (rate, capacity, a pause) and
   learns a refill from answers that say no rate (``learn.py``); the budgets take
   each one's word; a 429 is sent again while the retries allow.
6. **settle**: *settle* says what the request really spent, and the difference is
   given back or charged (``budgets.py``, ``shared_budgets.py``).

``adapter.py`` holds the flow itself, written once for threads and asyncio as
steps that `nanobucket._compose.drive` makes or awaits: ``Outbound._tries``
(the bucket, then sending and learning, and again after a 429) sends through
``Outbound._charging`` (the budgets, sending, settling). A request with a token
and room at hand, nothing to settle or share, takes neither: it goes straight
through.

What it may import: ``nanobucket._core`` and ``nanobucket._compose``.
"""
