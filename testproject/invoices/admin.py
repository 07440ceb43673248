"""Orders and invoices in the admin, with an "Export now" button on the invoices page."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest, HttpResponse
from django.urls import URLPattern, path
from django.views.decorators.http import require_POST

from django_locks import LockNotAcquiredError, locks
from testproject.invoices import export
from testproject.invoices.models import Invoice, Order


@admin.register(Order)
class OrderAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["pk", "customer", "total", "placed_at"]


@admin.register(Invoice)
class InvoiceAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["number", "amount", "issued_at", "exported_at", "export_token"]
    list_filter = [("exported_at", admin.EmptyFieldListFilter)]

    def get_urls(self) -> list[URLPattern]:
        export_now = self.admin_site.admin_view(require_POST(self.export_now))
        return [
            path("export-now/", export_now, name="invoices_invoice_export_now"),
            *super().get_urls(),
        ]

    def export_now(self, request: HttpRequest, *args: Any) -> HttpResponse:
        """Run the export now, unless it is running: wait up to 2 s for its lock, else 409."""
        if not self.has_change_permission(request):
            return HttpResponse("Forbidden", status=403)
        try:
            with locks.lock(export.KEY, wait="2s") as lock:
                sent = export.export_invoices(
                    lock, source="admin", user=request.user.get_username()
                )
        except LockNotAcquiredError:
            return HttpResponse("Export already running", status=409)
        invoices = "invoice" if sent == 1 else "invoices"
        return HttpResponse(f"Exported {sent} {invoices} (fencing token {lock.fencing_token})")
