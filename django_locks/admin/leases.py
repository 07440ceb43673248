"""``LeaseAdmin``: the "Leases" page. On the database store, Django's own changelist over the
``Lease`` table (filtered, searched, sorted, counted and paged in SQL, on the store's alias);
on any other store, the listing of the service's ``leases()`` (``listing.py``). Either way only
the keys of ``LOCKS["KEY_PREFIX"]``, shown and searched without it."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.contrib.admin import helpers
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import PermissionDenied
from django.db import DatabaseError
from django.db.models import F, QuerySet
from django.db.models.functions import Left, Now, Substr
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path
from django.utils.html import format_html
from django.utils.safestring import SafeString
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from django_locks.admin import listing
from django_locks.admin.permits import held_permits
from django_locks.admin.release import release
from django_locks.admin.rows import (
    LeaseView,
    ends_cell,
    holder_cell,
    key_cell,
    state_cell,
    time_cell,
)
from django_locks.admin.states import (
    STATE_VAR,
    StateFilter,
    held_q,
    state_expression,
    state_rank,
)
from django_locks.models import Lease
from django_locks.service import locks
from django_locks.stores.base import LockStore
from django_locks.stores.naming import describe_store

REFRESH_VAR = listing.REFRESH_VAR
REFRESH_DEFAULT = 5
"""Seconds between reloads offered by the page's "Refresh every 5 s" link."""
REFRESH_BOUNDS = (2, 3600)
"""The ``?refresh=`` values taken, in seconds; any other value leaves the page unrefreshed."""

ORDERING = (F("released_at").desc(nulls_first=True), "-expires_at")
"""Held leases first (latest expiry first), then expired ones, then released ones, each most
recent first."""


def database_alias(store: LockStore) -> str | None:
    """The alias of a database store (the page then reads its table), else ``None``."""
    from django_locks.stores.database import DatabaseStore

    return store.using if isinstance(store, DatabaseStore) else None


def refresh_seconds(request: HttpRequest) -> int | None:
    """The auto-refresh period asked for (``?refresh=5``), or ``None``: off."""
    value = request.GET.get(REFRESH_VAR, "")
    if not value.isdigit():
        return None
    seconds = int(value)
    low, high = REFRESH_BOUNDS
    return seconds if low <= seconds <= high else None


def lease_view(row: Lease) -> LeaseView:
    """The row as the page shows it (its key without the key prefix), made once per row
    (every cell of it asks)."""
    view = row.__dict__.get("_lease_view")
    if view is None:
        view = LeaseView.of_row(row).without_prefix(locks.key_prefix)
        row.__dict__["_lease_view"] = view
    return view


SHOWN_KEY = "shown_key"
"""The annotation of the key without the key prefix, which a search looks into."""


class LeaseChangeList(ChangeList):
    """Django's changelist, with ``?refresh=`` kept in every link but never taken for a
    filter, its page of rows read at once, how many of them are held (the action bar shows
    where there is one)."""

    held_on_page = 0

    def get_filters_params(self, params: dict[str, Any] | None = None) -> dict[str, Any]:
        lookup: dict[str, Any] = super().get_filters_params(params)
        lookup.pop(REFRESH_VAR, None)
        return lookup

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        self.result_list = list(self.result_list)
        self.held_on_page = sum(lease_view(row).held for row in self.result_list)
        # The action bar only where there is a lease to select.
        self.show_admin_actions = self.show_admin_actions and self.held_on_page > 0

    @property
    def selects_across(self) -> bool:
        """Whether "Select all N leases" is offered: on the page filtered to held leases, when
        they fill more than a page (the action releases held leases only)."""
        return self.params.get(STATE_VAR) == "held" and self.result_count > self.held_on_page

    @property
    def refresh_link(self) -> str:
        if REFRESH_VAR in self.params:
            return str(self.get_query_string(remove=[REFRESH_VAR]))
        return str(self.get_query_string({REFRESH_VAR: REFRESH_DEFAULT}))


@admin.register(Lease)
class LeaseAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """The "Leases" page: the configured store's leases, read-only, with a release action behind
    ``django_locks.release_lease``. Never the owner id: the release action posts keys."""

    change_list_template = "admin/django_locks/lease/change_list.html"
    list_display = (
        "lease_key",
        "state",
        "lease_holder",
        "fencing_token",
        "acquired",
        "last_renewed",
        "ends",
    )
    list_display_links = None
    list_filter = (StateFilter,)
    search_fields = ("key", "holder", "holder_kind", "holder_detail")
    search_help_text = gettext_lazy(
        "Search by key, or the holder's host:pid, kind or detail: any part of it, ignoring case."
    )
    ordering = ORDERING
    list_per_page = 100
    show_full_result_count = True
    actions = ["release_selected"]

    # Read-only: leases are written by the store, never through the admin.

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Lease | None = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Lease | None = None) -> bool:
        return False

    def has_release_permission(self, request: HttpRequest) -> bool:
        """Whether the user may free leases held by anyone (``django_locks.release_lease``)."""
        return request.user.has_perm(f"{self.opts.app_label}.release_lease")

    def get_urls(self) -> list[URLPattern]:
        # The changelist only: there is no add, change, delete or history page to reach.
        name = f"{self.opts.app_label}_{self.opts.model_name}_changelist"
        return [path("", self.admin_site.admin_view(self.changelist_view), name=name)]

    def get_queryset(self, request: HttpRequest) -> QuerySet[Lease]:
        """The store's rows on the store's alias (routers play no part), each with its state,
        the database's clock and (a key's summary under permits) how many of its slots are
        held, ordered as :data:`ORDERING` (or as sorted). Under a key prefix, only the rows of
        its keys (compared exactly: SQLite's LIKE would ignore case), each with its key
        without it (:data:`SHOWN_KEY`)."""
        alias = database_alias(locks.store) or "default"
        queryset = Lease._default_manager.using(alias).all()
        prefix = locks.key_prefix
        if prefix:
            queryset = (
                queryset.alias(key_head=Left("key", len(prefix)))
                .filter(key_head=prefix)
                .annotate(**{SHOWN_KEY: Substr("key", len(prefix) + 1)})
            )
        queryset = queryset.annotate(
            lease_state=state_expression(), listed_at=Now(), held_permits=held_permits()
        )
        return queryset.order_by(*(self.get_ordering(request) or ()))

    def get_search_fields(self, request: HttpRequest) -> tuple[str, ...]:
        """The key is searched as people see it: without the key prefix."""
        fields = tuple(self.search_fields)
        if locks.key_prefix:
            return tuple(SHOWN_KEY if name == "key" else name for name in fields)
        return fields

    def get_changelist(self, request: HttpRequest, **kwargs: Any) -> type[ChangeList]:
        return LeaseChangeList

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method == "POST" and not self.has_release_permission(request):
            raise PermissionDenied  # whatever the POST says: nothing is released
        store = locks.store
        context = {
            "title": _("Leases"),
            "store_name": describe_store(store),
            "key_prefix": locks.key_prefix,
            "refresh_seconds": refresh_seconds(request),
            **(extra_context or {}),
        }
        if database_alias(store) is None:
            return listing.listing_view(self, request, context)
        try:
            return super().changelist_view(request, context)
        except DatabaseError as exc:
            listing.store_unreadable(self, request, exc)
            return listing.listing_view(self, request, context, unreadable=True)

    # The columns (the listing page of other stores has the same: listing.COLUMNS).

    def action_checkbox(self, obj: Lease) -> SafeString:
        """Only a held lease can be selected for release. Its value is the row's primary key
        (what Django's action selects rows by); under a key prefix its label is the key
        without it."""
        view = lease_view(obj)
        if not view.held:
            return SafeString("&nbsp;")
        if not locks.key_prefix:
            return super().action_checkbox(obj)
        label = format_html(_("Select this object for an action - {}"), view.key)
        checkbox = forms.CheckboxInput({"class": "action-select", "aria-label": label})
        return SafeString(checkbox.render(helpers.ACTION_CHECKBOX_NAME, str(obj.pk)))

    @admin.display(description=gettext_lazy("Key"), ordering="key")
    def lease_key(self, obj: Lease) -> SafeString:
        return key_cell(lease_view(obj))

    @admin.display(description=gettext_lazy("State"), ordering=state_rank())
    def state(self, obj: Lease) -> SafeString:
        return state_cell(lease_view(obj))

    @admin.display(description=gettext_lazy("Holder"), ordering="holder")
    def lease_holder(self, obj: Lease) -> SafeString | str:
        return holder_cell(lease_view(obj))

    @admin.display(description=gettext_lazy("Acquired at"), ordering="acquired_at")
    def acquired(self, obj: Lease) -> SafeString | str:
        return time_cell(obj.acquired_at)

    @admin.display(description=gettext_lazy("Last renewed"), ordering="renewed_at")
    def last_renewed(self, obj: Lease) -> SafeString | str:
        return time_cell(lease_view(obj).last_renewed)

    @admin.display(description=gettext_lazy("Expires in / ended at"), ordering="expires_at")
    def ends(self, obj: Lease) -> SafeString | str:
        return ends_cell(lease_view(obj))

    # The release action.

    @admin.action(description=gettext_lazy("Release selected leases"), permissions=["release"])
    def release_selected(self, request: HttpRequest, queryset: QuerySet[Lease]) -> Any:
        """Confirm, then release the selected leases that are held (SQL says which: an ended
        row posted anyway is refused) through the service, by their keys without the key
        prefix; the confirmation posts the rows' primary keys back."""
        rows = {row.key: lease_view(row) for row in queryset.filter(held_q())}
        if request.POST.get("select_across") == "1":
            posted = list(rows)
        else:
            posted = list(dict.fromkeys(request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)))
        # A posted value that is no held row of this prefix stays as posted: found nowhere,
        # it is reported as not held.
        keys = list(dict.fromkeys(rows[pk].key if pk in rows else pk for pk in posted))
        held = {view.key: view for view in rows.values()}
        return release(self, request, keys, held, posted)
