"""Keys taken with permits in a listing of leases (the admin, ``manage.py locks``)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import Protocol

from django_locks.stores.base import LeaseInfo


class Listing(Protocol):
    """What lists leases: a service (its keys, without its prefix) or a store."""

    def leases(self, *, include_inactive: bool = False) -> list[LeaseInfo]: ...


def base_of(lease: LeaseInfo) -> str | None:
    """The key a slot belongs to (its key without ``#<permit>``); ``None`` for any other lease."""
    if lease.permit is None:
        return None
    return lease.key.removesuffix(f"#{lease.permit}")


def held_slots(leases: Iterable[LeaseInfo]) -> Counter[str]:
    """How many held slots each key taken with permits has among ``leases``."""
    return Counter(
        base for lease in leases if lease.state == "held" and (base := base_of(lease)) is not None
    )


def count_held_slots(source: Listing, key: str) -> int | None:
    """How many slots of ``key`` are held now (one listing of the held leases of ``source``,
    the service whose key it is), ``None`` when the store cannot list them. For a release's
    question and its report, before the release: a slot taken or freed meanwhile is not
    counted."""
    try:
        return held_slots(source.leases())[key]
    except NotImplementedError:
        return None
