"""The plan from the authentication dependency: ``RateLimit(tiered(...), plan=...)``.

A real FastAPI app with a real bearer-token dependency that resolves a user
object; the tiered limiter decides on the plan that user object names (no
``tier`` function at all), on both implementations (``impl``), under a
clock that stands still, so every count is exact.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from types import ModuleType
from typing import Annotated

import pytest
from fastapi import Depends, FastAPI, Header, HTTPException

import nanobucket as nb
from nanobucket.fastapi import RateLimit, header
from nanobucket.tiered import using_plan

from http_checks import MakeClient, asgi_client

__all__ = ("asgi_client",)  # a fixture, used by name


@dataclass
class User:
    id: str
    plan: str


def make_app(impl: ModuleType, users: dict[str, User], seen: list[str]) -> FastAPI:
    def current_user(authorization: Annotated[str, Header()]) -> User:
        user = users.get(authorization.removeprefix("Bearer "))
        if user is None:
            raise HTTPException(401, "unknown token")
        seen.append(user.id)
        return user

    limiter = nb.tiered(
        {
            "free": impl.KeyedTokenBucket(rate=1, capacity=2, clock=lambda: 0),
            "pro": impl.KeyedTokenBucket(rate=2, capacity=4, clock=lambda: 0),
        }
    )
    per_plan = RateLimit(
        limiter,
        key=lambda user=Depends(current_user): user.id,  # noqa: B008 - FastAPI's own idiom
        plan=lambda user=Depends(current_user): user.plan,  # noqa: B008
    )
    app = FastAPI()

    @app.get("/reports", dependencies=[Depends(per_plan)])
    async def reports() -> list[str]:
        return []

    return app


def _get(client: object, token: str) -> tuple[int, str | None]:
    r = client.get("/reports", headers={"Authorization": f"Bearer {token}"})  # type: ignore[attr-defined]
    return r.status_code, r.headers.get("ratelimit-policy")


def test_the_plan_comes_from_the_resolved_user(impl: ModuleType, asgi_client: MakeClient) -> None:
    users = {"t-alice": User("alice", "free"), "t-bob": User("bob", "pro")}
    seen: list[str] = []
    client = asgi_client(make_app(impl, users, seen))
    free, pro = '"free";q=2;w=2', '"pro";q=4;w=2'
    assert [_get(client, "t-alice") for _ in range(3)] == [(200, free), (200, free), (429, free)]
    assert [_get(client, "t-bob")[0] for _ in range(5)] == [200, 200, 200, 200, 429]
    assert seen == ["alice"] * 3 + ["bob"] * 5  # the user resolved once per request
    # An upgrade in the user store: alice's 2 spent tokens are carried to pro's 4.
    users["t-alice"].plan = "pro"
    assert [_get(client, "t-alice") for _ in range(3)] == [(200, pro), (200, pro), (429, pro)]
    # No user: the authentication's 401, and no bucket touched.
    assert _get(client, "t-nobody") == (401, None)


def test_a_plan_that_is_no_plan_is_a_500_with_the_names(
    impl: ModuleType, asgi_client: MakeClient
) -> None:
    users = {"t-eve": User("eve", "gold")}
    app = make_app(impl, users, [])
    with pytest.raises(ValueError, match=r"using_plan\('gold'\) named 'gold', which is not a plan"):
        asgi_client(app).get("/reports", headers={"Authorization": "Bearer t-eve"})


def test_plan_needs_a_tiered_limiter_and_a_function(impl: ModuleType) -> None:
    with pytest.raises(TypeError, match="plan= picks a plan of a tiered limiter, not of"):
        RateLimit(impl.KeyedTokenBucket(rate=1, capacity=1), plan=lambda: "free")
    limiter = nb.tiered({"free": impl.KeyedTokenBucket(rate=1, capacity=1)})
    with pytest.raises(TypeError, match="plan must be a function returning a plan name"):
        RateLimit(limiter, plan="free")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="plan must be a function returning a plan name"):
        RateLimit(limiter, plan=header("X-Plan"))  # type: ignore[arg-type]


def test_using_plan_is_per_task_and_tier_still_serves_the_rest(impl: ModuleType) -> None:
    limiter = nb.tiered(
        {
            "free": impl.KeyedTokenBucket(rate=1, capacity=1, clock=lambda: 0),
            "pro": impl.KeyedTokenBucket(rate=1, capacity=3, clock=lambda: 0),
        },
        tier=lambda key: "free",
    )

    async def as_pro() -> list[str]:
        with using_plan("pro"):
            await asyncio.sleep(0)
            return [limiter.check(key).plan for key in ("a", "b")]

    async def as_tier() -> list[str]:
        await asyncio.sleep(0)
        return [limiter.check(key).plan for key in ("c", "d")]

    async def both() -> list[list[str]]:
        return list(await asyncio.gather(as_pro(), as_tier()))

    assert asyncio.run(both()) == [["pro", "pro"], ["free", "free"]]
    no_tier = nb.tiered({"free": impl.KeyedTokenBucket(rate=1, capacity=1)})
    with pytest.raises(ValueError, match=r"no plan for 'alice': decide it inside using_plan"):
        no_tier.allow("alice")
