"""The Leases page of a store other than the database store (Redis, in-memory, custom): what its
``leases()`` lists, searched, filtered and paged here, with the filters the store can fill."""

from __future__ import annotations

from collections import Counter
from typing import Any, cast
from urllib.parse import urlencode

from django import forms
from django.contrib import messages
from django.contrib.admin import helpers
from django.core.paginator import Paginator
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.utils.translation import gettext as _
from django.utils.translation import gettext_lazy

from django_locks.admin.release import RELEASE_ACTION, release
from django_locks.admin.rows import LeaseView, cells
from django_locks.admin.states import LABELS, STATE_VAR, store_filters
from django_locks.exceptions import LocksError
from django_locks.service import locks
from django_locks.slots import held_slots
from django_locks.stores.base import LeaseInfo
from django_locks.stores.naming import describe_store

SEARCH_VAR = "q"
PAGE_VAR = "p"
REFRESH_VAR = "refresh"

TEMPLATE = "admin/django_locks/lease/leases.html"

COLUMNS = (
    ("lease_key", gettext_lazy("Key")),
    ("state", gettext_lazy("State")),
    ("lease_holder", gettext_lazy("Holder")),
    ("fencing_token", gettext_lazy("Fencing token")),
    ("acquired", gettext_lazy("Acquired at")),
    ("last_renewed", gettext_lazy("Last renewed")),
    ("ends", gettext_lazy("Expires in / ended at")),
)
"""The page's columns, as the database store's changelist has them (``LeaseAdmin``)."""

_ORDER = {"held": 0, "expired": 1}


def listing_view(
    model_admin: Any, request: HttpRequest, context: dict[str, Any], *, unreadable: bool = False
) -> HttpResponse:
    """The page, or (a POST) the release action on the keys posted; with ``unreadable``, the
    page without a lease (the store could not be read, a message says why)."""
    if request.method == "POST" and not unreadable:
        return release_posted(model_admin, request)
    store = locks.store
    leases = [] if unreadable else store_leases(model_admin, request)
    query = request.GET.get(SEARCH_VAR, "").strip()
    filters = store_filters(store)
    state = request.GET.get(STATE_VAR, "")
    if state not in filters:
        state = ""
    found = [view for view in leases if matches(view, query)]
    shown = [view for view in found if not state or view.state == state]
    paginator = Paginator(shown, model_admin.list_per_page)
    page = paginator.get_page(request.GET.get(PAGE_VAR))
    can_release = model_admin.has_release_permission(request)
    action_form = None
    if can_release and any(view.held for view in page.object_list):
        action_form = helpers.ActionForm(auto_id=False)
        cast(forms.ChoiceField, action_form.fields["action"]).choices = [
            ("", "---------"),
            (RELEASE_ACTION, _("Release selected leases")),
        ]
    params = {
        SEARCH_VAR: query,
        STATE_VAR: state,
        REFRESH_VAR: str(context.get("refresh_seconds") or ""),
    }
    state_choices = [
        {"display": _("All"), "selected": not state, "query_string": _query(params, state="")}
    ] + [
        {
            "display": f"{LABELS[value]} ({sum(view.state == value for view in found)})",
            "selected": state == value,
            "query_string": _query(params, state=value),
        }
        for value in filters
    ]
    held = [view for view in page.object_list if view.held]
    context = {
        **model_admin.admin_site.each_context(request),
        "title": _("Leases"),
        "subtitle": None,
        "opts": model_admin.opts,
        "app_label": model_admin.opts.app_label,
        "media": model_admin.media,
        "columns": COLUMNS,
        "empty_value_display": model_admin.get_empty_value_display(),
        "rows": [(view, cells(view)) for view in page.object_list],
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
        "state_choices": state_choices if filters else [],
        "has_active_filters": bool(state),
        "clear_filters_qs": _query(params, state=""),
        "refresh_link": _query(params, refresh="" if params[REFRESH_VAR] else "5"),
        "action_form": action_form,
        "actions_selection_counter": True,
        "selection_note": _("0 of %(cnt)s selected") % {"cnt": len(held)},
        # What admin/actions.html counts: the held rows, the only ones with a checkbox.
        "cl": {"result_list": held, "result_count": len(held), "held_on_page": len(held)},
        **context,
    }
    request.current_app = model_admin.admin_site.name
    return TemplateResponse(request, TEMPLATE, context)


def matches(view: LeaseView, query: str) -> bool:
    """Search: any part of the key or of the holder's ``host:pid``, kind or detail, as on the
    database store's page (and of its label too), ignoring case."""
    if not query:
        return True
    wanted = query.casefold()
    holder = view.holder
    if wanted in view.key.casefold():
        return True
    if holder is None:
        return False
    texts = (holder.address, holder.kind, holder.detail, str(holder))
    return any(wanted in text.casefold() for text in texts)


def store_leases(model_admin: Any, request: HttpRequest) -> list[LeaseView]:
    """Every lease the store lists (held, then expired, then ended; by key), or none with a
    message when the store cannot list them or cannot be reached."""
    try:
        leases = locks.leases(include_inactive=True)
    except (NotImplementedError, LocksError) as exc:
        store_unreadable(model_admin, request, exc)
        return []
    held = held_slots(leases)  # a summary's count, from the same listing
    views = [LeaseView.of_info(lease, held[lease.key]) for lease in leases]
    return sorted(views, key=lambda view: (_ORDER.get(view.state, 2), view.key))


def release_posted(model_admin: Any, request: HttpRequest) -> HttpResponse:
    """The release action on this page's POST: the keys posted, each looked up in the store
    (``lease(key)``: one call each; the listing of held leases only to count the held slots of
    a key taken with permits)."""
    if request.POST.get("action") != RELEASE_ACTION:
        model_admin.message_user(request, _("No action selected."), messages.WARNING)
        return HttpResponseRedirect(request.get_full_path())
    keys = list(dict.fromkeys(request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)))
    if not keys:
        model_admin.message_user(
            request,
            _(
                "Items must be selected in order to perform actions on them. No items have "
                "been changed."
            ),
            messages.WARNING,
        )
        return HttpResponseRedirect(request.get_full_path())
    found: dict[str, LeaseView] = {}
    try:
        infos = [_lease(key) for key in keys]
        # A held summary's count of held slots: one listing of the held leases, only then.
        summaries = any(info and info.is_summary and info.state == "held" for info in infos)
        held = held_slots(locks.leases()) if summaries else Counter[str]()
        for key, info in zip(keys, infos, strict=True):
            if info is not None:
                found[key] = LeaseView.of_info(info, held[key])
    except (NotImplementedError, LocksError) as exc:
        store_unreadable(model_admin, request, exc)
        found = {}
    response = release(model_admin, request, keys, found)
    return response or HttpResponseRedirect(request.get_full_path())


def _lease(key: str) -> LeaseInfo | None:
    """The lease on a posted key (without the key prefix), ``None`` for a key no lease could
    have (posted by hand: empty, too long with the prefix)."""
    try:
        return locks.lease(key, include_inactive=True)
    except (TypeError, ValueError):
        return None


def store_unreadable(model_admin: Any, request: HttpRequest, exc: BaseException) -> None:
    """The message for a store that cannot list its leases, or could not be reached."""
    name = describe_store(locks.store)
    if isinstance(exc, NotImplementedError):
        model_admin.message_user(
            request,
            _("The lock store %(store)s cannot list its leases.") % {"store": name},
            messages.WARNING,
        )
    else:
        model_admin.message_user(
            request,
            _("The lock store %(store)s could not be reached: %(error)s")
            % {"store": name, "error": exc},
            messages.ERROR,
        )


def _query(params: dict[str, str], **changes: Any) -> str:
    """``?q=...&state=...`` with ``changes`` applied, empty values left out."""
    merged = {**params, **changes}
    return "?" + urlencode({k: v for k, v in merged.items() if v not in ("", None)})
