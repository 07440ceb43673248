"""The etcd store (extra ``etcd``: ``pip install "django-distributed-locks[etcd]"``). etcd3gw is
imported by ``wire`` and ``checks``, and nowhere else in django_locks."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured

try:
    import etcd3gw  # noqa: F401
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImproperlyConfigured(
        'django_locks.stores.EtcdStore needs etcd3gw: pip install "django-distributed-locks[etcd]".'
    ) from exc

from django_locks.stores.etcd.store import EtcdStore

__all__ = ["EtcdStore"]
