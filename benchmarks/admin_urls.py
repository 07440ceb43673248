"""The admin benchmark's URLs: django_locks' Leases page on the default admin site, and the
reference on a second site, a plain ``ModelAdmin`` on ``Lease`` (imported once Django is set up:
``benchmarks/admin.py`` names this module as ``ROOT_URLCONF``)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.db.models import QuerySet
from django.db.models.functions import Now
from django.http import HttpRequest
from django.urls import path

from django_locks.admin.leases import ORDERING
from django_locks.models import Lease


class HeldFilter(admin.SimpleListFilter):
    """The held filter as a project would write it: the same WHERE as the Leases page's."""

    title = "state"
    parameter_name = "state"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [("held", "Held")]

    def queryset(self, request: HttpRequest, queryset: QuerySet[Any]) -> QuerySet[Any] | None:
        if self.value() == "held":
            return queryset.filter(released_at__isnull=True, expires_at__gt=Now())
        return None


class PlainLeaseAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    """Django's own changelist on the table: the model's columns, the same ordering, 100 rows a
    page and the full result count, as the Leases page."""

    list_display = ("key", "holder", "fencing_token", "acquired_at", "renewed_at", "expires_at")
    list_filter = (HeldFilter,)
    search_fields = ("key", "holder")
    ordering = ORDERING
    list_per_page = 100
    show_full_result_count = True


plain_site = admin.AdminSite(name="plain")
plain_site.register(Lease, PlainLeaseAdmin)

urlpatterns = [path("admin/", admin.site.urls), path("plain/", plain_site.urls)]
