"""Authentication without a database, for the Django tests.

``HeaderUser`` (a middleware) and ``HeaderAuthentication`` (DRF) read
``X-User: <pk>`` and set an authenticated user with that pk, as
``AuthenticationMiddleware`` sets ``request.user`` and ``request.auser``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.contrib.auth.models import AnonymousUser
from rest_framework.authentication import BaseAuthentication


class User:
    is_authenticated = True

    def __init__(self, pk: int) -> None:
        self.pk = pk


def user_of(request: Any) -> Any:
    pk = request.META.get("HTTP_X_USER")
    return User(int(pk)) if pk else AnonymousUser()


class HeaderUser:
    sync_capable = async_capable = True

    def __init__(self, get_response: Callable[[Any], Any]) -> None:
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: Any) -> Any:
        request.user = user_of(request)

        async def auser() -> Any:
            return request.user

        request.auser = auser
        return self.get_response(request)


class HeaderAuthentication(BaseAuthentication):  # type: ignore[misc]
    def authenticate(self, request: Any) -> tuple[Any, None] | None:
        user = user_of(request)
        return (user, None) if user.is_authenticated else None
