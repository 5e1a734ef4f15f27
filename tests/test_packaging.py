"""What an install of nanobucket declares: its extras."""

from __future__ import annotations


def test_the_integrations_have_extras() -> None:
    from importlib.metadata import metadata

    meta = metadata("nanobucket")
    extras = set(meta.get_all("Provides-Extra") or ())
    assert {"redis", "fastapi", "django", "prometheus", "otel", "test", "plot", "bench"} <= extras
    requires = set(meta.get_all("Requires-Dist") or ())
    assert {
        'redis>=5; extra == "redis"',
        'fastapi; extra == "fastapi"',
        'django; extra == "django"',
        'prometheus_client; extra == "prometheus"',
        'opentelemetry-api; extra == "otel"',
    } <= requires
