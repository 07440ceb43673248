"""Products, reconciliations and alerts in the admin."""

from __future__ import annotations

from django.contrib import admin

from testproject.inventory.models import Product, Reconciliation, StockAlert


@admin.register(Product)
class ProductAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["sku", "name", "in_stock", "reconciled_at", "stock_token"]


@admin.register(Reconciliation)
class ReconciliationAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["started_at", "fencing_token", "worker", "beat", "written"]


@admin.register(StockAlert)
class StockAlertAdmin(admin.ModelAdmin):  # type: ignore[type-arg]
    list_display = ["position", "product", "message", "leader", "fencing_token", "received_at"]
