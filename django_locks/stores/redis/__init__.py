"""The Redis store: ``RedisStore`` (``store``), its Lua scripts and key names (``scripts``),
their replies read (``replies``), options (``options``), Cluster routing (``cluster``),
connections and calls (``wire``) and system checks (``checks``). redis-py is imported here
and nowhere else in django_locks."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

try:
    import redis  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImproperlyConfigured(
        "django_locks.stores.RedisStore needs redis-py: "
        "pip install 'django-distributed-locks[redis]'."
    ) from exc

from django_locks.stores.redis.store import RedisStore

__all__ = ["RedisStore"]
