"""The Redis store's system checks: persistence and eviction of every master (W201-W206), and
the replicas `min_replicas` asks for (W207)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

import redis.exceptions
from django.core import checks

from django_locks.exceptions import StoreError
from django_locks.stores.redis.scripts import pack

if TYPE_CHECKING:
    from django_locks.stores.redis.store import RedisStore

CHECK_TIMEOUT = 2.0
"""Seconds each check's calls may take: a check never hangs ``manage.py check``."""


def check_store(store: RedisStore) -> list[Any]:
    """Warnings about each master's persistence and eviction settings, or W206 when the server
    cannot be reached."""
    try:
        found: list[Any] = []
        for node in store._primaries(time.monotonic() + CHECK_TIMEOUT):
            found += _check_node(store, node)
        return found
    except StoreError as exc:
        return [
            checks.Warning(
                f"django_locks could not reach {store} to check its "
                f"persistence and eviction settings: {exc.__cause__ or exc}",
                hint="Start the server or fix LOCKS['OPTIONS'], then run the check again.",
                id="django_locks.W206",
            )
        ]


def _check_node(store: RedisStore, node: tuple[str, int] | None) -> list[Any]:
    deadline = time.monotonic() + CHECK_TIMEOUT
    pool = store._pool(node, "ops")
    found = replica_warnings(store, pool, deadline)
    config = {}
    try:
        for name in ("appendonly", "appendfsync", "save", "maxmemory-policy"):
            reply = pool.call(pack("CONFIG", "GET", name), deadline)
            config[name] = reply[1].decode() if reply else ""
    except StoreError as exc:
        if not isinstance(exc.__cause__, redis.exceptions.ResponseError):
            raise
        return [
            *found,
            checks.Warning(
                f"Redis at {pool.where} refuses CONFIG GET ({exc.__cause__}), as managed Redis "
                "services often do: django_locks cannot verify that it persists leases and "
                "fencing counters and never evicts them.",
                hint="In your provider's settings make sure of: appendonly yes, appendfsync "
                "always, maxmemory-policy noeviction. Then silence this warning with "
                "SILENCED_SYSTEM_CHECKS = ['django_locks.W205'].",
                id="django_locks.W205",
            ),
        ]
    return found + config_warnings(pool.where, config)


def config_warnings(where: str, config: dict[str, str]) -> list[Any]:
    """W201-W204 for one server's ``CONFIG GET`` answers."""
    found = []
    fix = "Set 'appendonly yes' and 'appendfsync always' in redis.conf (or with CONFIG SET)."
    if config["appendonly"] != "yes" and not config["save"].strip():
        found.append(
            checks.Warning(
                f"Redis at {where} has no persistence (appendonly no, save ''): a restart "
                "frees every held lock at once, so two processes can hold one lock.",
                hint=fix,
                id="django_locks.W201",
            )
        )
    elif config["appendonly"] != "yes":
        found.append(
            checks.Warning(
                f"Redis at {where} persists only RDB snapshots (appendonly no): a restart "
                "frees every lock taken since the last snapshot while its holder still runs.",
                hint=fix,
                id="django_locks.W202",
            )
        )
    elif config["appendfsync"] != "always":
        found.append(
            checks.Warning(
                f"Redis at {where} fsyncs its append-only file '{config['appendfsync']}', not "
                "'always': a crash of the machine can lose the last locks taken, and the "
                "fencing counters then depend on the server's clock alone.",
                hint="Set 'appendfsync always' in redis.conf (or with CONFIG SET).",
                id="django_locks.W203",
            )
        )
    if config["maxmemory-policy"] != "noeviction":
        found.append(
            checks.Warning(
                f"Redis at {where} evicts keys (maxmemory-policy {config['maxmemory-policy']}): "
                "under memory pressure it can delete a held lock (every lease has a TTL, so "
                "volatile-* policies evict them too).",
                hint="Set 'maxmemory-policy noeviction', and keep caches on another Redis.",
                id="django_locks.W204",
            )
        )
    return found


def replica_warnings(store: RedisStore, pool: Any, deadline: float) -> list[Any]:
    """W207: ``min_replicas`` above the replicas connected to the master (``INFO
    replication``), so that every acquire would fail as unconfirmed; or the count refused."""
    if not store.min_replicas:
        return []
    fix = "or lower min_replicas."
    try:
        info = pool.call(pack("INFO", "replication"), deadline)
    except StoreError as exc:
        if not isinstance(exc.__cause__, redis.exceptions.ResponseError):
            raise
        return [
            checks.Warning(
                f"Redis at {pool.where} refuses INFO replication ({exc.__cause__}): django_locks "
                f"cannot verify that {store.min_replicas} replicas (min_replicas) are connected.",
                hint=f"Check the replicas in your provider's console, {fix}",
                id="django_locks.W207",
            )
        ]
    fields = dict(
        line.split(":", 1) for line in info.decode(errors="replace").splitlines() if ":" in line
    )
    connected = int(fields.get("connected_slaves", "0") or 0)
    if connected >= store.min_replicas:
        return []
    return [
        checks.Warning(
            f"RedisStore option 'min_replicas' is {store.min_replicas} but Redis at {pool.where} "
            f"has {connected} connected replica{'s' if connected != 1 else ''} "
            f"(role {fields.get('role', '?').strip()}): every acquire and every renewal will "
            "fail as unconfirmed (a StoreError).",
            hint="Attach the replicas (replicaof) and look at INFO replication on the master, "
            + fix,
            id="django_locks.W207",
        )
    ]
