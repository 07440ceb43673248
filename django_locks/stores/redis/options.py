"""The Redis store's options (``LOCKS["OPTIONS"]``) and the ``CACHES`` entry it may borrow from."""

from __future__ import annotations

import dataclasses
from typing import Any
from urllib.parse import urlsplit

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from redis.backoff import NoBackoff
from redis.connection import Connection, parse_url
from redis.retry import Retry

from django_locks.durations import Duration, timeout_seconds
from django_locks.stores.redis import sentinel

CACHE_BACKENDS = ("django_redis.cache.RedisCache", "django.core.cache.backends.redis.RedisCache")
# Options of the cache that are ours to decide (timeouts, pool size) or meaningless to a
# redis-py connection; the rest (db, username, password, ssl_*) are taken as they are.
_CACHE_IGNORED = {"pool_class", "parser_class", "socket_timeout", "socket_connect_timeout"}
_CACHE_IGNORED |= {"max_connections", "retry", "retry_on_timeout", "health_check_interval"}


@dataclasses.dataclass(frozen=True)
class Options:
    """The store's options, checked; ``connection_kwargs`` are what each redis-py
    ``Connection`` of the store is built with (its connect timeout is added per connection)."""

    url: str | None  # None with sentinels and no url: the master's address is asked
    cache: str | None
    prefix: str
    socket_timeout: float
    socket_connect_timeout: float
    max_connections: int
    cluster: bool
    sentinels: list[tuple[str, int]]  # the Sentinels to ask for the master; [] without
    service_name: str | None
    min_replicas: int  # replicas that must confirm each acquire and renewal (WAIT); 0: none
    replica_timeout_ms: int  # how long WAIT waits for them
    extra: dict[str, Any]  # the cache's connection options, for the Cluster's discovery
    connection_class: type[Any]
    connection_kwargs: dict[str, Any]


def parse(
    *,
    url: str | None,
    cache: str | None,
    prefix: str,
    socket_timeout: Duration,
    socket_connect_timeout: Duration,
    max_connections: int,
    cluster: bool,
    min_replicas: int = 0,
    replica_timeout: Duration = 0.1,
    sentinels: Any = None,
    service_name: Any = None,
) -> Options:
    """Check the options of ``RedisStore`` (``ImproperlyConfigured`` naming the option, the rule
    and the value); no I/O."""
    if sentinels is not None or service_name is not None:
        if sentinels is None or service_name is None:
            raise ImproperlyConfigured(
                "RedisStore options 'sentinels' and 'service_name' go together: the Sentinels "
                "to ask, and the name they monitor the master by."
            )
        if cluster:
            raise ImproperlyConfigured(
                "RedisStore option 'sentinels' is not available with cluster=True: Redis "
                "Cluster fails over by itself. Drop one of them."
            )
    asked = url is None and cache is None and sentinels is not None
    if asked:
        url = "redis://localhost/0"  # no credentials, db 0: the master's address is asked
    if (url is None) == (cache is None):
        raise ImproperlyConfigured(
            "RedisStore needs exactly one of the options 'url' (a Redis URL such as "
            "'redis://localhost:6379/0') or 'cache' (an alias of a Redis cache in CACHES), "
            "or 'sentinels' with 'service_name' for a Sentinel-managed master."
        )
    if not isinstance(prefix, str) or not prefix or {"{", "}"} & set(prefix):
        raise ImproperlyConfigured(
            f"RedisStore option 'prefix' must be a non-empty string without braces, got "
            f"{prefix!r}: set it to a name such as 'myproject_locks'."
        )
    if isinstance(max_connections, bool) or not isinstance(max_connections, int):
        raise ImproperlyConfigured(
            f"RedisStore option 'max_connections' must be an int, got {max_connections!r}."
        )
    if max_connections < 1:
        raise ImproperlyConfigured(
            f"RedisStore option 'max_connections' must be at least 1, got {max_connections}."
        )
    if not isinstance(cluster, bool):
        raise ImproperlyConfigured(f"RedisStore option 'cluster' must be a bool, got {cluster!r}.")
    try:
        read_timeout = timeout_seconds(socket_timeout, name="socket_timeout")
        connect_timeout = timeout_seconds(socket_connect_timeout, name="socket_connect_timeout")
        # WAIT 0 would wait for ever: at least 1 ms.
        replica_wait = timeout_seconds(replica_timeout, name="replica_timeout")
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(f"RedisStore option {exc}") from exc
    _check_replicas(min_replicas, replica_wait, read_timeout, cluster=cluster)
    if cache is not None:
        url, extra = from_cache(cache)
    else:
        extra = {}
    if not isinstance(url, str):
        raise ImproperlyConfigured(f"RedisStore option 'url' must be a string, got {url!r}.")
    try:
        # The URL wins over the cache's options, as in redis-py's from_url.
        options = {**extra, **parse_url(url)}  # type: ignore[no-untyped-call]
    except (ValueError, TypeError) as exc:
        raise ImproperlyConfigured(
            f"RedisStore option 'url' is not a Redis URL ({exc}): use "
            "'redis://[[username]:password@]host:port/db', 'rediss://...' or 'unix://path'."
        ) from exc
    options.pop("max_connections", None)  # the store's own option, not the URL's
    # Set per connection by the wire (the connect timeout cut to the call's time left, the
    # handshake that refuses a reconnect past the deadline): the store's options win over a
    # URL's ?socket_connect_timeout=, as they did before.
    options.pop("socket_connect_timeout", None)
    options.pop("redis_connect_func", None)
    connection_class: type[Any] = options.pop("connection_class", Connection)
    followed = sentinel.addresses(sentinels) if sentinels is not None else []
    connection_kwargs = {
        **options,
        # The bound of a read is the call's deadline, kept by the watchdog (SPEC section 4:
        # never by the thread doing the I/O); a call may be given longer than socket_timeout.
        "socket_timeout": None,
        # One attempt per call: retrying is the caller's decision, within its deadline.
        "retry": Retry(NoBackoff(), 0),
        # RESP2: the server sends nothing but the replies to what was asked (no RESP3 push
        # messages), so a call's replies are read in step.
        "protocol": 2,
    }
    if followed:
        connection_class, connection_kwargs = sentinel.connection(
            followed, service_name, connection_kwargs, connection_class
        )
    return Options(
        url=None if asked else url,
        cache=cache,
        prefix=prefix,
        socket_timeout=read_timeout,
        socket_connect_timeout=connect_timeout,
        max_connections=max_connections,
        cluster=cluster,
        sentinels=followed,
        service_name=service_name if followed else None,
        min_replicas=min_replicas,
        replica_timeout_ms=round(replica_wait * 1000),
        extra=extra,
        connection_class=connection_class,
        connection_kwargs=connection_kwargs,
    )


MAX_REPLICAS = 1000
"""The most ``min_replicas`` may ask for: far more replicas than one master serves."""


def _check_replicas(
    min_replicas: int, replica_timeout: float, socket_timeout: float, *, cluster: bool
) -> None:
    if (
        isinstance(min_replicas, bool)
        or not isinstance(min_replicas, int)
        or not 0 <= min_replicas <= MAX_REPLICAS
    ):
        raise ImproperlyConfigured(
            f"RedisStore option 'min_replicas' must be an int of 0 to {MAX_REPLICAS} (the "
            f"replicas that must confirm each acquire and renewal), got {min_replicas!r}."
        )
    if min_replicas and cluster:
        raise ImproperlyConfigured(
            "RedisStore option 'min_replicas' is not available with cluster=True: no test shows "
            "WAIT reaching the replicas of the key's own shard. Use min_replicas on a lone "
            "master (with Sentinel), or leave it 0 on Redis Cluster."
        )
    if min_replicas and replica_timeout >= socket_timeout:
        raise ImproperlyConfigured(
            f"RedisStore option 'replica_timeout' ({replica_timeout:g} s) must be shorter than "
            f"'socket_timeout' ({socket_timeout:g} s), the bound of each call it is part of: "
            "lower replica_timeout (a replica on the same network confirms within a few ms)."
        )


def from_cache(alias: str) -> tuple[str, dict[str, Any]]:
    """The URL and connection options of the Redis cache ``alias``, read from settings only."""
    caches = getattr(settings, "CACHES", {})
    if alias not in caches:
        raise ImproperlyConfigured(
            f"RedisStore option 'cache' names {alias!r}, which is not in CACHES "
            f"({', '.join(map(repr, caches)) or 'none defined'}): name a Redis cache, or use 'url'."
        )
    config = caches[alias]
    if config.get("BACKEND") not in CACHE_BACKENDS:
        raise ImproperlyConfigured(
            f"RedisStore option 'cache' names {alias!r}, whose BACKEND {config.get('BACKEND')!r} "
            f"is not a Redis cache: use one of {', '.join(CACHE_BACKENDS)}, or the 'url' option."
        )
    location = config.get("LOCATION")
    if isinstance(location, list | tuple):
        # Both backends write to the first location; the others are read replicas.
        location = location[0] if location else None
    if not isinstance(location, str) or not location:
        location = None
    if location and "," in location:
        location = location.split(",")[0]
    if location is None:
        raise ImproperlyConfigured(
            f"The cache {alias!r} has no LOCATION: set it to a Redis URL, or use 'url'."
        )
    options = dict(config.get("OPTIONS") or {})
    if config["BACKEND"].startswith("django_redis"):
        extra = dict(options.get("CONNECTION_POOL_KWARGS") or {})
        for name in ("PASSWORD", "USERNAME"):
            if name in options:
                extra[name.lower()] = options[name]
    else:
        extra = {k: v for k, v in options.items() if k == k.lower()}
    return location, {k: v for k, v in extra.items() if k not in _CACHE_IGNORED}


def redact(url: str | None) -> str:
    """``url`` without its credentials, for messages and ``repr``."""
    if url and "@" in url:
        scheme, _, rest = url.partition("://")
        return f"{scheme}://***@{rest.rpartition('@')[2]}"
    return url or ""


def label(options: Options) -> str:
    """The store named for people (``Redis 127.0.0.1:6379/0``, ``Redis Cluster 10.0.0.5:7000``,
    ``(cache "locks")`` after it when borrowed from a cache); never the password."""
    kind = "Redis Cluster" if options.cluster else "Redis"
    parts = urlsplit(options.url or "")
    if options.sentinels:
        first = ":".join(map(str, options.sentinels[0]))
        where = f"Sentinel {options.service_name!r} ({first}"
        where += f" and {len(options.sentinels) - 1} more)" if len(options.sentinels) > 1 else ")"
    elif parts.scheme == "unix":
        where = parts.path
    else:
        where = f"{parts.hostname or 'localhost'}:{parts.port or 6379}"
        db = parts.path.strip("/")
        if db and not options.cluster:
            where += f"/{db}"
    return f'{kind} {where} (cache "{options.cache}")' if options.cache else f"{kind} {where}"


def where(kwargs: dict[str, Any], node: tuple[str, int] | None) -> str:
    """The server a connection goes to, as people read it (``127.0.0.1:6379``, a socket path,
    the master of a Sentinel service)."""
    if "connection_pool" in kwargs:
        return f"the master of Sentinel service {kwargs['connection_pool'].service_name!r}"
    host, port = node or (kwargs.get("host"), kwargs.get("port"))
    return f"{host}:{port}" if host else str(kwargs.get("path"))
