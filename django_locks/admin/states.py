"""How a lease stands or ended, as the Leases page shows and filters it: in SQL for the database
store's ``Lease`` rows, from ``LeaseInfo`` for the other stores."""

from __future__ import annotations

from typing import Any, Literal

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.db.models import Case, CharField, F, IntegerField, Q, QuerySet, Value, When
from django.db.models.functions import Now
from django.http import HttpRequest
from django.utils.translation import gettext_lazy

from django_locks.stores.base import LeaseInfo, LockStore

State = Literal[
    "held", "expired", "lapsed", "handed back", "released", "force released", "max hold"
]
"""What the State column says: ``held``, or how the lease ended (SPEC section 8)."""

STATE_VAR = "state"

LABELS: dict[str, Any] = {
    "held": gettext_lazy("Held"),
    "expired": gettext_lazy("Expired"),
    "lapsed": gettext_lazy("Lapsed"),
    "handed back": gettext_lazy("Handed back"),
    "released": gettext_lazy("Released"),
    "force released": gettext_lazy("Force released"),
    "max hold": gettext_lazy("Max hold"),
}

FILTERS: tuple[State, ...] = (
    "held",
    "released",
    "handed back",
    "lapsed",
    "expired",
    "max hold",
    "force released",
)
"""The state filter's choices, in the order shown."""

# The reasons a row records (``Lease.end_reason``) that the page shows instead of a plain
# "released" (for a released row) or "expired" (for one whose lease ran out).
_RELEASE_ENDS = ("handed back", "force released")
_EXPIRY_ENDS = ("lapsed", "handed back", "max hold")


# The database store's rows, in SQL. A row is held while not released and not expired on the
# database's clock. Its end_reason counts only when the row's new columns describe this lease
# (described_token = fencing_token): a lease a 0.1.0 process took leaves the previous lease's
# reason behind, and then shows as plain released or expired (SPEC section 9).


def _described() -> Q:
    return Q(described_token=F("fencing_token"))


def _ran_out() -> Q:
    return Q(released_at__isnull=True, expires_at__lte=Now())


def held_q() -> Q:
    """Held: not released, not expired on the database's clock."""
    return Q(released_at__isnull=True, expires_at__gt=Now())


def state_q(state: str) -> Q:
    """The rows in ``state`` (one of :data:`FILTERS`); every row is in exactly one."""
    released = Q(released_at__isnull=False)
    if state == "held":
        return held_q()
    if state == "released":
        return released & ~(_described() & Q(end_reason__in=_RELEASE_ENDS))
    if state == "expired":
        return _ran_out() & ~(_described() & Q(end_reason__in=_EXPIRY_ENDS))
    if state == "lapsed":
        return _ran_out() & _described() & Q(end_reason="lapsed")
    if state == "handed back":
        return (released | _ran_out()) & _described() & Q(end_reason="handed back")
    if state == "force released":
        return released & _described() & Q(end_reason="force released")
    if state == "max hold":
        return _ran_out() & _described() & Q(end_reason="max hold")
    raise ValueError(f"`state` must be one of {', '.join(FILTERS)}, got {state!r}")


def _state_case(values: dict[str, Any], output_field: Any) -> Case:
    reason = F("end_reason")
    return Case(
        When(held_q(), then=values["held"]),
        When(
            Q(released_at__isnull=False) & _described() & Q(end_reason__in=_RELEASE_ENDS),
            then=values.get("reason", reason),
        ),
        When(released_at__isnull=False, then=values["released"]),
        When(_described() & Q(end_reason__in=_EXPIRY_ENDS), then=values.get("reason", reason)),
        default=values["expired"],
        output_field=output_field,
    )


def state_expression() -> Case:
    """The row's :data:`State` as SQL (agrees with :func:`state_q`)."""
    return _state_case(
        {"held": Value("held"), "released": Value("released"), "expired": Value("expired")},
        CharField(),
    )


def state_rank() -> Case:
    """A sort key for the State column: held, then crashed, clean ends, released by hand."""
    rank = Case(
        *(When(end_reason=name, then=Value(index)) for index, name in enumerate(FILTERS)),
        default=Value(len(FILTERS)),
        output_field=IntegerField(),
    )
    return _state_case(
        {
            "held": Value(0),
            "released": Value(FILTERS.index("released")),
            "expired": Value(FILTERS.index("expired")),
            "reason": rank,
        },
        IntegerField(),
    )


class StateFilter(admin.SimpleListFilter):
    """ "By state" on the database store: each choice one WHERE (:func:`state_q`)."""

    title = gettext_lazy("state")
    parameter_name = STATE_VAR

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, Any]]:
        return [(state, LABELS[state]) for state in FILTERS]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        value = self.value()
        if value is None:
            return None
        if value not in FILTERS:
            raise IncorrectLookupParameters(f"unknown state {value!r}")
        return queryset.filter(state_q(value))


# The other stores: what their LeaseInfo says.


def info_state(lease: LeaseInfo) -> State:
    """The :data:`State` of a lease a store listed (``held``, else its ``ended`` when the
    store recorded one that fits its state, else plain ``released`` / ``expired``)."""
    if lease.state == "held":
        return "held"
    ended = lease.ended
    if lease.state == "released":
        return ended if ended in _RELEASE_ENDS else "released"
    return ended if ended in _EXPIRY_ENDS else "expired"


def store_filters(store: LockStore) -> tuple[State, ...]:
    """The state filters a store that lists through ``leases()`` can fill: none for a store
    that keeps only live leases (Redis: every row is held); held, released and expired for a
    store that keeps ended leases; and how they ended for one that records it."""
    if not store.keeps_ended_leases:
        return ()
    if not store.describes_holders:
        return ("held", "released", "expired")
    return FILTERS
