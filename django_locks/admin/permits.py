"""Keys taken with permits on the database store's Leases page: how many slots of each key's own
row (its summary) are held, counted inside the page's one query."""

from __future__ import annotations

from typing import Any

from django.db.models import (
    BooleanField,
    Case,
    Count,
    F,
    Func,
    IntegerField,
    OuterRef,
    Q,
    Subquery,
    When,
)
from django.db.models.functions import Coalesce

from django_locks.admin.states import held_q
from django_locks.models import Lease
from django_locks.stores.base import PERMITS_OWNER


class InSlotRange(Func):
    """``key`` among the slot keys of ``base``: from ``base#`` (included) to ``base$``
    (excluded), every key that starts with ``base#``. Compared byte by byte whatever the
    database's collation (PostgreSQL's ``~>=~``: a language collation may ignore the ``#``),
    which is what makes it a range of the primary key's index (on PostgreSQL its
    ``varchar_pattern_ops`` twin) rather than a scan of the table for each row of the page:
    the table has no index on ``base_key``, on purpose (see ``Lease.Meta``)."""

    arity = 2
    conditional = True
    output_field = BooleanField()

    def as_sql(  # type: ignore[override]  # none of Func's templating is used
        self, compiler: Any, connection: Any, **extra_context: Any
    ) -> tuple[str, tuple[Any, ...]]:
        (key, key_params), (base, base_params) = (
            compiler.compile(expression) for expression in self.get_source_expressions()
        )
        at_least, below = ("~>=~", "~<~") if connection.vendor == "postgresql" else (">=", "<")
        sql = f"({key} {at_least} ({base} || '#') AND {key} {below} ({base} || '$'))"
        return sql, (*key_params, *base_params, *key_params, *base_params)


def summary_q() -> Q:
    """The own row of a key taken with permits: ``permits`` recorded, no base key, and the
    owner the store gives it (a previous release's process that took the key since wrote its
    own owner: the row is then that plain lease's)."""
    return Q(permits__isnull=False, base_key__isnull=True, owner=PERMITS_OWNER)


def held_permits() -> Case:
    """For a summary row, how many of its slots are held (on the database's clock); ``NULL``
    for every other row. A subquery evaluated for summary rows only, each an index range."""
    slots = (
        Lease.objects.filter(InSlotRange(F("key"), OuterRef("key")), base_key=OuterRef("key"))
        .filter(held_q())
        .order_by()
        .values("base_key")
        .annotate(held=Count("*"))
        .values("held")
    )
    return Case(
        When(summary_q(), then=Coalesce(Subquery(slots), 0)),
        default=None,
        output_field=IntegerField(),
    )
