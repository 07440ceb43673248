"""W307 and W308 of ``EtcdStore.check``: ``LOCKS["TTL"]`` against the cluster's minimum lease
TTL (learnt from one lease grant, revoked at once) and against a leader election's time."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured

from django_locks.exceptions import StoreError
from django_locks.policy import POLICY
from django_locks.stores.etcd.leases import Granted
from django_locks.stores.etcd.wire import Wire

if TYPE_CHECKING:
    from django_locks.stores.etcd.store import EtcdStore

CHECK_TIMEOUT = 2.0
"""Seconds each check's calls may take: a check never hangs ``manage.py check``."""


def ttl_messages(store: EtcdStore) -> list[Any]:
    """W307: ``LOCKS["TTL"]`` is below the effective ttl, learnt from one lease grant; W308: it
    is too short to ride out a leader election."""
    from django_locks import conf  # conf imports the stores' base

    try:
        ttl_ms = conf.read().ttl_ms
    except ImproperlyConfigured:
        return []  # reported by E001
    process = store._process.get()
    deadline = Wire.deadline(CHECK_TIMEOUT)
    try:
        granted = process.leases.grant(1, deadline)
        process.wire.call("lease/revoke", {"ID": str(granted.id)}, deadline)
    except StoreError as exc:
        return [
            checks.Warning(
                f"django_locks could not learn the minimum lease TTL of the etcd cluster of "
                f"{store} (a lease grant failed: {exc}), so LOCKS['TTL'] is not checked "
                "against it.",
                hint="Run the check again once the cluster answers.",
                id="django_locks.W307",
            )
        ]
    effective_ms = store.effective_ttl_ms(ttl_ms)
    messages = [] if effective_ms <= ttl_ms else [_rounded_up(ttl_ms, effective_ms, granted, store)]
    rides = POLICY.etcd_election_ttl(granted.ttl_s)
    if effective_ms < rides * 1000:
        messages.append(
            checks.Warning(
                f"LOCKS['TTL'] is {ttl_ms / 1000:g} s, too short to ride out a leader election of "
                f"the etcd cluster of {store}: a renewal sent as the leader dies is answered "
                f"once a new leader is elected (up to about two election timeouts; the "
                f"cluster's minimum lease TTL, {granted.ttl_s} s, is about 1.5 of them) plus "
                f"one {POLICY.etcd_attempt:g} s attempt, and a renewal has two thirds of the "
                f"ttl before the holder's deadline. Holders would lose their locks "
                f'(detected_by="deadline") at each election, although their keys survive.',
                hint=f"Set LOCKS['TTL'] to at least '{rides}s' (a lock's own ttl too), or lower "
                "the members' --election-timeout.",
                id="django_locks.W308",
            )
        )
    return messages


def _rounded_up(ttl_ms: int, effective_ms: int, granted: Granted, store: EtcdStore) -> Any:
    lives, minimum, ttl = effective_ms // 1000, granted.ttl_s, f"{ttl_ms / 1000:g} s"
    return checks.Warning(
        f"LOCKS['TTL'] is {ttl}, but a lock lives {lives} s on etcd ({store}): etcd grants "
        "leases in whole seconds and never shorter than the cluster's minimum lease TTL, "
        f"{minimum} s here (about 1.5 x the members' --election-timeout). A holder that "
        f"crashes keeps its locks for {lives} s, so takeover (P5) takes up to {lives} s, "
        f"plus the election timeout when the leader changed, not {ttl}.",
        hint=f"Set LOCKS['TTL'] to at least '{lives}s', so that the settings say what etcd "
        "does (a lock's own ttl below it is rounded up the same way); if locks must lapse "
        "sooner, lower the members' --election-timeout (and --heartbeat-interval with it), "
        "which the minimum lease TTL follows.",
        id="django_locks.W307",
    )
