"""Django settings for the Django tests and the real-server test (no database is used).

``NB_RATE`` / ``NB_CAPACITY`` (the real-server test) give the middleware an
in-process `KeyedTokenBucket`; the in-process tests set ``NANOBUCKET`` with
``override_settings`` instead.
"""

from __future__ import annotations

import os

import nanobucket as nb

SECRET_KEY = "nanobucket-tests-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "django_urls"
INSTALLED_APPS = ["django.contrib.contenttypes", "django.contrib.auth", "rest_framework"]
DATABASES: dict[str, dict[str, str]] = {}
MIDDLEWARE = ["django_auth.HeaderUser"]
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["django_auth.HeaderAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": [],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_THROTTLE_RATES": {"drf": "10/hour"},
}
CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache"}}
LOGGING_CONFIG = None

if "NB_CAPACITY" in os.environ:
    NANOBUCKET = {
        "limiter": nb.KeyedTokenBucket(
            rate=float(os.environ["NB_RATE"]), capacity=int(os.environ["NB_CAPACITY"])
        ),
        "exempt": ["/bare"],
    }
    MIDDLEWARE = [*MIDDLEWARE, "nanobucket.django.RateLimitMiddleware"]
