"""The Django project of the Django tests as an ASGI app, for the real-uvicorn test."""

from __future__ import annotations

import os

from django.core.asgi import get_asgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "django_settings")
application = get_asgi_application()
