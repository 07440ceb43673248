"""``LeaseAdmin``: the admin's "Leases" page, built on the configured store's ``leases()``.

The page is not a changelist over the ``Lease`` table: it lists what ``locks.store.leases()``
returns, so the Redis store, the in-memory store and a custom store show their leases with the
same look, and the database store reads on its own connection to its own alias (routers play no
part). It is read-only; releasing a lease is an action behind the ``django_locks.release_lease``
permission, confirmed on a second page and recorded in the admin log.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from typing import Any, cast
from urllib.parse import urlencode

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import helpers
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import URLPattern, path
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy, ngettext

from django_locks.exceptions import LocksError
from django_locks.models import Lease
from django_locks.service import locks
from django_locks.stores.base import LeaseInfo

logger = logging.getLogger("django_locks")

SEARCH_VAR = "q"
STATE_VAR = "state"
PAGE_VAR = "p"
RELEASE_ACTION = "release_selected"
STATES = (
    ("held", gettext_lazy("Held")),
    ("expired", gettext_lazy("Expired")),
    ("released", gettext_lazy("Released")),
)
_STATE_ORDER = {state: rank for rank, (state, _label) in enumerate(STATES)}


@dataclasses.dataclass(frozen=True)
class LeaseRow:
    """A ``LeaseInfo`` as the page shows it."""

    lease: LeaseInfo
    host: str
    pid: str
    expires: str

    @classmethod
    def of(cls, lease: LeaseInfo) -> LeaseRow:
        host, sep, pid = lease.holder.rpartition(":")
        if not sep or not pid.isdigit():
            host, pid = lease.holder, ""
        return cls(lease=lease, host=host, pid=pid, expires=describe_expiry(lease))


def describe_expiry(lease: LeaseInfo) -> str:
    """ "in 29s", "expired 4m 10s ago", or "" for a released lease (or one without expiry)."""
    if lease.expires_in is None or lease.state == "released":
        return ""
    if lease.expires_in > datetime.timedelta(0):
        return _("in %(duration)s") % {"duration": short_duration(lease.expires_in)}
    return _("expired %(duration)s ago") % {"duration": short_duration(-lease.expires_in)}


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


@admin.register(Lease)
class LeaseAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """The "Leases" page: the configured store's leases, held ones first, read-only."""

    change_list_template = "admin/django_locks/lease/leases.html"
    release_confirmation_template = "admin/django_locks/lease/release_selected_confirmation.html"
    list_per_page = 100
    actions = None

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

    def changelist_view(
        self, request: HttpRequest, extra_context: dict[str, Any] | None = None
    ) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        if request.method == "POST":
            return self.release_action(request)
        leases = self.store_leases(request)
        query = request.GET.get(SEARCH_VAR, "").strip()
        state = request.GET.get(STATE_VAR, "")
        if state not in _STATE_ORDER:
            state = ""
        found = [lease for lease in leases if not query or query.casefold() in lease.key.casefold()]
        shown = [lease for lease in found if not state or lease.state == state]
        paginator = Paginator([LeaseRow.of(lease) for lease in shown], self.list_per_page)
        page = paginator.get_page(request.GET.get(PAGE_VAR))
        can_release = self.has_release_permission(request)
        action_form = None
        if can_release:
            action_form = helpers.ActionForm(auto_id=False)
            cast(forms.ChoiceField, action_form.fields["action"]).choices = [
                ("", "---------"),
                (RELEASE_ACTION, _("Release selected leases")),
            ]
        params = {SEARCH_VAR: query, STATE_VAR: state}
        state_choices = [
            {
                "display": _("All"),
                "selected": not state,
                "query_string": _query(params, state=""),
            }
        ] + [
            {
                "display": f"{label} ({sum(lease.state == value for lease in found)})",
                "selected": state == value,
                "query_string": _query(params, state=value),
            }
            for value, label in STATES
        ]
        context = {
            **self.admin_site.each_context(request),
            "title": _("Leases"),
            "subtitle": None,
            "opts": self.opts,
            "app_label": self.opts.app_label,
            "media": self.media,
            "store": locks.store,
            "rows": page.object_list,
            "page": page,
            "page_items": [
                (number, _query(params, p=number) if isinstance(number, int) else "")
                for number in paginator.get_elided_page_range(page.number)
            ],
            "result_count": paginator.count,
            "full_count": len(leases),
            "query": query,
            "state": state,
            "hidden_params": {k: v for k, v in params.items() if v and k != SEARCH_VAR},
            "state_choices": state_choices,
            "has_active_filters": bool(state),
            "clear_filters_qs": _query(params, state=""),
            "action_form": action_form,
            "actions_selection_counter": True,
            "selection_note": _("0 of %(cnt)s selected") % {"cnt": len(page.object_list)},
            "selection_note_all": ngettext(
                "%(total_count)s selected", "All %(total_count)s selected", len(page.object_list)
            )
            % {"total_count": len(page.object_list)},
            "cl": {"result_list": page.object_list, "result_count": len(page.object_list)},
            "empty_value_display": self.get_empty_value_display(),
            **(extra_context or {}),
        }
        request.current_app = self.admin_site.name
        return TemplateResponse(request, self.change_list_template, context)

    def store_leases(self, request: HttpRequest) -> list[LeaseInfo]:
        """Every lease the store lists (held, then expired, then released; by key), or none with
        a message when the store cannot list them or cannot be reached."""
        try:
            leases = locks.store.leases(include_inactive=True)
        except (NotImplementedError, LocksError) as exc:
            self.store_unreadable(request, exc)
            return []
        return sorted(leases, key=lambda lease: (_STATE_ORDER[lease.state], lease.key))

    def store_leases_of(self, request: HttpRequest, keys: list[str]) -> dict[str, LeaseInfo]:
        """The store's lease of each of ``keys`` (held, expired or released, where it keeps
        them), one ``lease(key)`` each, never the whole listing; with a message, as
        :meth:`store_leases` gives, when the store cannot describe them or be reached."""
        found: dict[str, LeaseInfo] = {}
        try:
            for key in keys:
                lease = locks.store.lease(key, include_inactive=True)
                if lease is not None:
                    found[key] = lease
        except (NotImplementedError, LocksError) as exc:
            self.store_unreadable(request, exc)
            return {}
        return found

    def store_unreadable(self, request: HttpRequest, exc: BaseException) -> None:
        """The message for a store that cannot list its leases, or could not be reached."""
        if isinstance(exc, NotImplementedError):
            self.message_user(
                request,
                _("The lock store %(store)s cannot list its leases.") % {"store": locks.store},
                messages.WARNING,
            )
        else:
            self.message_user(
                request,
                _("The lock store %(store)s could not be reached: %(error)s")
                % {"store": locks.store, "error": exc},
                messages.ERROR,
            )

    def release_action(self, request: HttpRequest) -> HttpResponse:
        """The "Release selected leases" action: a confirmation page, then ``force_release``.

        Refused with 403 for a user without the release permission, whatever the POST says.
        """
        if not self.has_release_permission(request):
            raise PermissionDenied
        if request.POST.get("action") != RELEASE_ACTION:
            self.message_user(request, _("No action selected."), messages.WARNING)
            return HttpResponseRedirect(request.get_full_path())
        keys = list(dict.fromkeys(request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)))
        if not keys:
            self.message_user(
                request,
                _(
                    "Items must be selected in order to perform actions on them. No items have "
                    "been changed."
                ),
                messages.WARNING,
            )
            return HttpResponseRedirect(request.get_full_path())
        listed = self.store_leases_of(request, keys)
        if request.POST.get("post") != "yes":
            context = {
                **self.admin_site.each_context(request),
                "title": _("Are you sure?"),
                "subtitle": None,
                "opts": self.opts,
                "app_label": self.opts.app_label,
                "media": self.media,
                "keys": keys,
                "rows": [(key, listed.get(key)) for key in keys],
                "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
                "action": RELEASE_ACTION,
            }
            request.current_app = self.admin_site.name
            return TemplateResponse(request, self.release_confirmation_template, context)
        released: list[str] = []
        not_held: list[str] = []
        for key in keys:
            try:
                freed = locks.store.force_release(key)
            except LocksError as exc:
                self.message_user(
                    request,
                    _("Releasing %(key)s failed: %(error)s") % {"key": key, "error": exc},
                    messages.ERROR,
                )
                continue
            (released if freed else not_held).append(key)
            if freed:
                lease = listed.get(key)
                detail = (
                    f" (fencing token {lease.fencing_token}, holder {lease.holder or '?'})"
                    if lease is not None
                    else ""
                )
                self.log_change(request, Lease(key=key), f"Released by hand{detail}.")
                logger.warning(
                    "Lease %r released by hand by %s in the admin%s", key, request.user, detail
                )
        if released:
            self.message_user(
                request,
                ngettext(
                    "Released %(count)d lease: its holder loses it at its next renewal.",
                    "Released %(count)d leases: their holders lose them at their next renewal.",
                    len(released),
                )
                % {"count": len(released)},
                messages.SUCCESS,
            )
        if not_held:
            self.message_user(
                request,
                _("Not held any more, nothing to release: %(keys)s")
                % {"keys": ", ".join(not_held)},
                messages.WARNING,
            )
        return HttpResponseRedirect(request.get_full_path())


def _query(params: dict[str, str], **changes: Any) -> str:
    """``?q=...&state=...`` with ``changes`` applied, empty values left out."""
    merged = {**params, **changes}
    return "?" + urlencode({k: v for k, v in merged.items() if v not in ("", None)})
