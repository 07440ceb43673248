"""``sentinels=`` / ``service_name=``: the Redis store's connections follow a Sentinel-managed
master, on redis-py's public Sentinel API.

Each new connection asks the Sentinels for the master's address (redis-py's
``SentinelManagedConnection``); a connection to a master demoted to a replica answers
``READONLY``, which that class turns into a ``ConnectionError`` after disconnecting, so the store
discards it and the next connection asks the Sentinels again. The idempotent scripts (acquire,
renew) are sent again once on a fresh connection when a pooled one fails, so a failover costs a
call at most once per connection (the store's usual rule, ``wire.Pool.call``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from redis.connection import SSLConnection
from redis.sentinel import (
    Sentinel,
    SentinelConnectionPool,
    SentinelManagedConnection,
    SentinelManagedSSLConnection,
)

SENTINEL_TIMEOUT = 0.5
"""Seconds one Sentinel may take to answer where the master is, before the next is asked."""


def addresses(sentinels: Any) -> list[tuple[str, int]]:
    """``sentinels`` checked: a list of ``"host:port"`` strings or ``(host, port)`` pairs."""
    rule = (
        "RedisStore option 'sentinels' must be a non-empty list of 'host:port' strings or "
        f"(host, port) pairs, such as ['10.0.0.1:26379', '10.0.0.2:26379'], got {sentinels!r}."
    )
    if isinstance(sentinels, str | bytes | dict | set) or not isinstance(sentinels, Sequence):
        raise ImproperlyConfigured(rule)
    found = []
    for item in sentinels:
        if isinstance(item, str):
            host, sep, port = item.rpartition(":")
            if not sep:
                raise ImproperlyConfigured(rule)
            item = (host, port)
        if not isinstance(item, Sequence) or len(item) != 2 or not isinstance(item[0], str):
            raise ImproperlyConfigured(rule)
        host, port = item[0].strip("[]"), item[1]
        try:
            number = int(port)
        except (TypeError, ValueError):
            raise ImproperlyConfigured(rule) from None
        if not host or isinstance(port, bool) or not 0 < number < 65536:
            raise ImproperlyConfigured(rule)
        found.append((host, number))
    if not found:
        raise ImproperlyConfigured(rule)
    return found


def connection(
    sentinels: list[tuple[str, int]],
    service_name: Any,
    kwargs: dict[str, Any],
    connection_class: type[Any],
) -> tuple[type[Any], dict[str, Any]]:
    """The connection class and keyword arguments of a connection to ``service_name``'s master,
    over TLS when the URL said ``rediss://`` (the Sentinels asked without the URL's credentials:
    they have their own)."""
    if not isinstance(service_name, str) or not service_name:
        raise ImproperlyConfigured(
            "RedisStore option 'service_name' must be the name the Sentinels monitor the master "
            f"by (sentinel monitor <name> ...), such as 'mymaster', got {service_name!r}."
        )
    timeouts = {"socket_timeout": SENTINEL_TIMEOUT, "socket_connect_timeout": SENTINEL_TIMEOUT}
    manager = Sentinel(sentinels, sentinel_kwargs=timeouts)
    pool = SentinelConnectionPool(service_name, manager)  # type: ignore[no-untyped-call]
    kwargs = {**kwargs, "connection_pool": pool.proxy}
    kwargs.pop("host", None)
    kwargs.pop("port", None)
    if issubclass(connection_class, SSLConnection):
        return SentinelManagedSSLConnection, kwargs
    return SentinelManagedConnection, kwargs
