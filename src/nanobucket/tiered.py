"""Per-plan limits: one keyed limiter whose rate and capacity come from each caller's plan.

``tiered(plans, tier=...)`` takes one keyed limiter per plan, all of one
backend kind (in-process, shared memory, Redis; sync or asyncio), and a
``tier(key) -> plan name`` function called on every request::

    limiter = tiered(
        {"free": KeyedTokenBucket(rate=10, capacity=20),
         "pro": KeyedTokenBucket(rate=100, capacity=200)},
        tier=lambda user: plan_of_user[user],
    )
    limiter.allow("alice")        # decided by alice's plan's bucket

It is keyed like its plans, so it goes wherever they go: ``all_of``,
``Waiting``, ``@limit``, the middlewares and the FastAPI dependency. Its
decisions are `TieredDecision`: the plan's own, naming the ``plan``; the
``RateLimit-Policy`` header names it (``"free";q=20;w=2``). A name ``tier``
returns that is no plan raises ``ValueError``, unless a ``default`` plan is
given (then it is that plan: anonymous or unknown callers).

**Moving between plans keeps what was spent.** The limiter remembers the
plan it last served each key on. When ``tier`` names another one, the key's
spent tokens there (``capacity - remaining``, whole tokens, a fraction
refilled counts as spent) are carried: the new plan's bucket is charged
until it has spent as many, at most its capacity. An upgrade of a key with
15 of 20 spent leaves 185 of 200; a downgrade with 150 of 200 spent leaves
an empty bucket of 20, the next token one interval away. The plan left keeps
its bucket, which refills on its own.

**Hopping never gains a token.** Over any span of time a key is admitted at
most what the most generous plan it was served on admits: the largest
capacity among those plans plus the fastest rate times the span. A key that
went down to a smaller plan with more spent than it holds keeps that debt
here, so coming back up through a third plan, or to its old plan after a
smaller, faster one refilled, gives nothing twice (see `nanobucket._compose.carry.carry`). A
key this limiter has not seen (or has forgotten) is carried from every other plan.

Bounds and races. At most ``max_keys`` plans are remembered; past it the
oldest eighth is forgotten: a forgotten key's next request costs one
``peek`` per plan, and one still in debt has its debt charged to its bucket
of the largest plan first, so forgetting never gains a token (it may cost a
forgotten key some of the extra a larger plan would have given it). Moves
are one at a time per limiter (a lock; per key in asyncio), so two callers
switching one key at once carry it once. A request another thread or
process decides on the plan left while the move reads it is not carried;
with shared memory or Redis each process remembers what it saw, so a key
whose plan changes and changes back while this process does not see it is
not carried here (its bucket of that plan is as this process left it,
refilled since). A plan whose backend cannot answer (Redis down: a fallback
or policy decision) is not read: the move is tried again on the next
request.
"""

from ._compose.tiered import (
    AsyncTiered,
    Tiered,
    TieredDecision,
    tiered,
    using_plan,
)

__all__ = ["AsyncTiered", "Tiered", "TieredDecision", "tiered", "using_plan"]
