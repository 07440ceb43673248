"""One lease as the Leases page shows it (``LeaseView``), from a ``Lease`` row or a ``LeaseInfo``,
and the HTML of its cells. Never the owner id: it is the holder's secret."""

from __future__ import annotations

import dataclasses
import datetime
import re
from typing import Any

from django.templatetags.static import static
from django.utils import timezone
from django.utils.html import escape, format_html
from django.utils.safestring import SafeString, mark_safe
from django.utils.translation import gettext as _

from django_locks.admin.states import LABELS, State, info_state
from django_locks.holders import LABEL_DETAIL, Holder
from django_locks.models import Lease
from django_locks.slots import base_of
from django_locks.stores.base import LeaseInfo

ICONS = {
    "held": "icon-yes.svg",
    "expired": "icon-alert.svg",
    "force released": "icon-alert.svg",
}
"""Held, and the ends an operator looks into (a crash, a release by hand); clean ends have none."""

_BREAK_AFTER = re.compile(r"([:/.#])")


@dataclasses.dataclass(frozen=True)
class LeaseView:
    """A lease for the page: its key, :data:`State`, holder (``None``: the store kept none),
    token and times. ``ends_in`` is the time left while held (on the store's clock), minus the
    time since it ended once ended, ``None`` when unknown; ``ended_at`` when it ended, where
    the store says."""

    key: str
    state: State
    holder: Holder | None
    fencing_token: int
    acquired_at: datetime.datetime | None
    last_renewed: datetime.datetime | None = None
    ends_in: datetime.timedelta | None = None
    ended_at: datetime.datetime | None = None
    ended_by: str | None = None
    # A key taken with permits: on a slot, its ``base`` key, its ``permit`` and the key's
    # ``permits``; on the key's own record (the summary), ``permits`` and how many of its
    # slots are held (``held_permits``), and no holder.
    base: str | None = None
    permit: int | None = None
    permits: int | None = None
    held_permits: int | None = None

    @property
    def held(self) -> bool:
        return self.state == "held"

    def without_prefix(self, prefix: str) -> LeaseView:
        """The lease as people see it under a service's key prefix: its key (and a slot's base
        key) without ``prefix``, which the store's rows carry."""
        if not prefix:
            return self
        base = None if self.base is None else self.base.removeprefix(prefix)
        return dataclasses.replace(self, key=self.key.removeprefix(prefix), base=base)

    @property
    def is_summary(self) -> bool:
        """Whether this is a key's own record under permits (held while any slot is)."""
        return self.held_permits is not None

    @property
    def permits_freed(self) -> int:
        """How many permits releasing it frees: a held slot's one, a summary's held slots."""
        if not self.held:
            return 0
        return self.held_permits if self.held_permits is not None else 1

    @property
    def label(self) -> str:
        """ "Held", "Expired", "Force released by admin alice", ..."""
        if self.state == "force released" and self.ended_by:
            return _("Force released by %(who)s") % {"who": self.ended_by}
        return str(LABELS[self.state])

    @classmethod
    def of_row(cls, row: Lease) -> LeaseView:
        """A ``Lease`` row annotated with ``lease_state`` and ``listed_at`` (the database's
        clock) by the page's queryset. The new columns count only when they describe this
        lease (``described_token``): a 0.1.0 process's lease shows its host and pid alone."""
        described = row.described_token is not None and row.described_token == row.fencing_token
        state: State = row.lease_state  # type: ignore[attr-defined]
        now: datetime.datetime = row.listed_at  # type: ignore[attr-defined]
        held = state == "held"
        ended_at = row.expires_at if held else (row.released_at or row.expires_at)
        base, permit = _slot_of(row, described)
        held_permits: int | None = row.__dict__.get("held_permits")
        holder = None
        if row.holder and held_permits is None:  # a summary has no holder: its slots do
            holder = Holder.parse(
                row.holder,
                kind=row.holder_kind if described else None,
                detail=row.holder_detail if described else None,
                since=row.acquired_at,
                expires_at=row.expires_at if held else None,
            )
        return cls(
            key=row.key,
            state=state,
            holder=holder,
            fencing_token=row.fencing_token,
            acquired_at=row.acquired_at,
            last_renewed=row.renewed_at if described else None,
            ends_in=ended_at - now,
            ended_at=None if held else ended_at,
            ended_by=row.ended_by if described and state == "force released" else None,
            base=base,
            permit=permit,
            permits=row.permits if permit is not None or held_permits is not None else None,
            held_permits=held_permits,
        )

    @classmethod
    def of_info(cls, lease: LeaseInfo, held_permits: int = 0) -> LeaseView:
        """A lease a store listed (``expires_in`` measured on its clock when it listed);
        ``held_permits``: for the summary of a key taken with permits, how many of its slots
        are held."""
        state = info_state(lease)
        ends_in = lease.expires_in
        ended_at = None
        if state != "held" and ends_in is not None:
            ended_at = timezone.now() + ends_in
        return cls(
            key=lease.key,
            state=state,
            holder=(
                lease.described
                if (lease.holder or lease.holder_info) and not lease.is_summary
                else None
            ),
            fencing_token=lease.fencing_token,
            acquired_at=lease.acquired_at,
            last_renewed=lease.last_renewed,
            ends_in=ends_in,
            ended_at=ended_at,
            ended_by=lease.ended_by if state == "force released" else None,
            base=base_of(lease),
            permit=lease.permit,
            permits=lease.permits,
            held_permits=held_permits if lease.is_summary else None,
        )


def _slot_of(row: Lease, described: bool) -> tuple[str | None, int | None]:
    """A slot row's base key and permit (its key is ``<base>#<permit>``), else ``(None, None)``.
    Only where this lease's columns describe it: a row recording a base key and permits that
    another process's plain lease took since is a plain lease."""
    if row.base_key is None or row.permits is None or not described:
        return None, None
    base, _, permit = row.key.rpartition("#")
    if base != row.base_key or not permit.isdigit():
        return None, None
    return base, int(permit)


def short_duration(value: datetime.timedelta) -> str:
    """``2d 3h``, ``4m 10s``, ``29s``, ``350ms``: the two largest units, for a glance."""
    ms = int(value.total_seconds() * 1000)
    if ms < 1000:
        return f"{ms}ms"
    seconds = ms // 1000
    parts: list[tuple[int, str]] = []
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        count, seconds = divmod(seconds, size)
        if count or parts:
            parts.append((count, unit))
    return " ".join(f"{count}{unit}" for count, unit in parts[:2] if count)


# Cells.


def key_cell(view: LeaseView) -> SafeString:
    """The key, breakable after ``:`` ``/`` ``.`` ``#`` (a ``<wbr>``), never inside a word.
    A slot shows its base key and ``permit 2 of 5``; a key's summary under permits, ``5
    permits, 3 held``. ``data-key`` is the lease's own key (a slot's ``<key>#<n>``)."""
    pieces = _BREAK_AFTER.split(view.base if view.base is not None else view.key)
    wrapped = "".join(
        escape(piece) + ("<wbr>" if _BREAK_AFTER.fullmatch(piece) else "") for piece in pieces
    )
    note = permits_note(view)
    return format_html(
        '<span class="lease-key" data-key="{}">{}</span>{}',
        view.key,
        mark_safe(wrapped),
        format_html(' <span class="lease-permit">{}</span>', note) if note else "",
    )


def permits_note(view: LeaseView) -> str:
    """``permit 2 of 5`` for a slot, ``5 permits, 3 held`` for a key's summary, else ``""``."""
    if view.permit is not None and view.permits is not None:
        return _("permit %(permit)d of %(permits)d") % {
            "permit": view.permit,
            "permits": view.permits,
        }
    if view.held_permits is not None and view.permits is not None:
        # permits is 2 or more: never one permit.
        return _("%(permits)d permits, %(held)d held") % {
            "permits": view.permits,
            "held": view.held_permits,
        }
    return ""


def state_cell(view: LeaseView) -> SafeString:
    """The state with its icon, and who released it by hand (each part kept on one line)."""
    icon = ICONS.get(view.state)
    image = format_html('<img src="{}" alt="">', static(f"admin/img/{icon}")) if icon else ""
    by = ""
    if view.state == "force released" and view.ended_by:
        by = format_html(
            ' <span class="lease-by">{}</span>', _("by %(who)s") % {"who": view.ended_by}
        )
    return format_html(
        '<span class="lease-state" data-state="{}"><span class="lease-how">{}{}</span>{}</span>',
        view.state,
        image,
        LABELS[view.state],
        by,
    )


def holder_title(holder: Holder) -> str:
    """The holder with its times, and its whole ``detail`` where the label shortened it."""
    title = holder.describe()
    if len(holder.detail) > LABEL_DETAIL:
        title += "\n" + holder.detail
    return title


def holder_cell(view: LeaseView) -> SafeString | str:
    """The one-line label (host, pid, kind, detail); its title carries the whole of it."""
    if view.holder is None:
        return ""
    return format_html(
        '<span class="lease-holder" title="{}">{}</span>', holder_title(view.holder), view.holder
    )


def time_cell(moment: datetime.datetime | None) -> SafeString | str:
    """``2026-12-01 14:02:10`` in the admin's time zone, the exact instant in ``datetime``."""
    if moment is None:
        return ""
    local = timezone.localtime(moment) if timezone.is_aware(moment) else moment
    return format_html(
        '<time datetime="{}"><span class="lease-date">{}</span> '
        '<span class="lease-time">{}</span></time>',
        moment.isoformat(),
        local.strftime("%Y-%m-%d"),
        local.strftime("%H:%M:%S"),
    )


def ends_cell(view: LeaseView) -> SafeString | str:
    """Held: ``in 29s`` (on the store's clock). Ended: when (where the store says) and how long
    ago, ``2026-12-01 14:02:10 (4m 10s ago)``."""
    if view.held:
        if view.ends_in is None:
            return ""
        text = _("in %(duration)s") % {"duration": short_duration(view.ends_in)}
        return format_html('<span class="lease-in">{}</span>', text)
    ago = ""
    if view.ends_in is not None:
        ago = _("%(duration)s ago") % {"duration": short_duration(max(-view.ends_in, _ZERO))}
    if view.ended_at is None:
        return ago
    return (
        format_html('{} <span class="lease-ago">({})</span>', time_cell(view.ended_at), ago)
        if ago
        else time_cell(view.ended_at)
    )


_ZERO = datetime.timedelta(0)


def cells(view: LeaseView) -> dict[str, Any]:
    """Every cell of a row, by column name (the listing page's template)."""
    return {
        "lease_key": key_cell(view),
        "state": state_cell(view),
        "lease_holder": holder_cell(view),
        "fencing_token": view.fencing_token,
        "acquired": time_cell(view.acquired_at),
        "last_renewed": time_cell(view.last_renewed),
        "ends": ends_cell(view),
    }
