"""The shared table of the gunicorn test app, one per process.

Set in the master by ``shared_anon_gunicorn_conf.on_starting`` (anonymous,
inherited by every worker it forks), or in each worker by
``shared_wsgi_app.attach`` (a named table, opened by path).
"""

from __future__ import annotations

from nanobucket.shared import SharedKeyedTokenBucket

table: SharedKeyedTokenBucket | None = None
