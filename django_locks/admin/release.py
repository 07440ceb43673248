"""The "Release selected leases" action of the Leases page: a confirmation page, then the
service's ``force_release`` for each lease still held (a key as people see it, without the
service's key prefix), recorded in the admin log and on the logger. A key's summary under
permits frees every slot of the key; a slot, that permit alone."""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from typing import Any

from django.contrib import messages
from django.contrib.admin import helpers
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.utils.translation import gettext as _
from django.utils.translation import ngettext

from django_locks.admin.rows import LeaseView
from django_locks.exceptions import LocksError
from django_locks.models import Lease
from django_locks.service import locks
from django_locks.stores.naming import describe_store

logger = logging.getLogger("django_locks")

RELEASE_ACTION = "release_selected"

CONFIRMATION_TEMPLATE = "admin/django_locks/lease/release_selected_confirmation.html"


def released_by(request: HttpRequest) -> str:
    """Who the store records as having released the lease: ``admin <username>``."""
    return f"admin {request.user.get_username()}"


def release(
    model_admin: Any,
    request: HttpRequest,
    keys: Sequence[str],
    leases: Mapping[str, LeaseView],
    posted: Sequence[str] | None = None,
) -> HttpResponse | None:
    """Ask for confirmation of releasing ``keys`` (without the key prefix; ``leases``: what
    the store said of each, those it did not list left out), or, once confirmed
    (``post=yes``), release the ones still held. An ended lease is never released, whatever
    was posted. ``posted``: what the confirmation posts back to select them again (the rows'
    primary keys on the database store's changelist; default ``keys``). Returns the
    confirmation page, or ``None`` once done (the caller redirects back to the list)."""
    covered = covered_slots(keys, leases)
    if request.POST.get("post") != "yes":
        opts = model_admin.opts
        context = {
            **model_admin.admin_site.each_context(request),
            "title": _("Are you sure?"),
            "subtitle": None,
            "opts": opts,
            "app_label": opts.app_label,
            "media": model_admin.media,
            "store_name": describe_store(locks.store),
            "keys": keys,
            "posted": keys if posted is None else posted,
            "rows": [(key, leases.get(key), key in covered) for key in keys],
            "permits_freed": sum(
                view.permits_freed
                for key, view in leases.items()
                if key in keys and key not in covered and view.permits is not None
            ),
            "action_checkbox_name": helpers.ACTION_CHECKBOX_NAME,
            "action": RELEASE_ACTION,
        }
        request.current_app = model_admin.admin_site.name
        return TemplateResponse(request, CONFIRMATION_TEMPLATE, context)
    released: list[LeaseView] = []
    not_held: list[str] = []
    by = released_by(request)
    for key in keys:
        lease = leases.get(key)
        if key in covered:
            continue  # freed with its key's other permits
        if lease is None or not lease.held:
            not_held.append(key)
            continue
        try:
            freed = locks.force_release(key, by=by)
        except LocksError as exc:
            model_admin.message_user(
                request,
                _("Releasing %(key)s failed: %(error)s") % {"key": key, "error": exc},
                messages.ERROR,
            )
            continue
        if not freed:
            not_held.append(key)
            continue
        released.append(lease)
        detail = _audit_detail(lease)
        model_admin.log_change(request, Lease(key=key), f"Released by hand{detail}.")
        logger.warning(
            "Lease %r of %s released by hand by %s in the admin%s",
            key,
            describe_store(locks.store),
            request.user.get_username(),
            detail,
        )
    if released:
        # A key's summary frees its held slots: each a holder's lease.
        count = sum(view.permits_freed for view in released)
        model_admin.message_user(
            request,
            ngettext(
                "Released %(count)d lease: its holder loses it at its next renewal.",
                "Released %(count)d leases: their holders lose them at their next renewal.",
                count,
            )
            % {"count": count},
            messages.SUCCESS,
        )
    for view in released:
        if view.is_summary:
            model_admin.message_user(
                request,
                ngettext(
                    "Freed every permit of %(key)s: %(count)d was held.",
                    "Freed every permit of %(key)s: %(count)d were held.",
                    view.permits_freed,
                )
                % {"key": view.key, "count": view.permits_freed},
                messages.SUCCESS,
            )
    if not_held:
        model_admin.message_user(
            request,
            _("Not held any more, nothing to release: %(keys)s") % {"keys": ", ".join(not_held)},
            messages.WARNING,
        )
    return None


def covered_slots(keys: Sequence[str], leases: Mapping[str, LeaseView]) -> set[str]:
    """The selected slots whose key's summary is selected and held too: releasing the key
    frees them (each is then neither released twice nor reported as not held)."""
    summaries = {key for key in keys if (view := leases.get(key)) and view.is_summary and view.held}
    return {
        key for key in keys if (view := leases.get(key)) and view.held and view.base in summaries
    }


def _audit_detail(lease: LeaseView) -> str:
    """What the admin log and the warning say of a released lease (never its owner id)."""
    if lease.is_summary:
        return (
            f" (every permit of the key: {lease.permits} permits, {lease.held_permits} held; "
            f"fencing token {lease.fencing_token})"
        )
    permit = ""
    if lease.permit is not None:
        permit = f"permit {lease.permit} of {lease.permits} of {lease.base!r}, "
    return f" ({permit}fencing token {lease.fencing_token}, holder {lease.holder or '?'})"
