"""The stock reconciliation: every five minutes, on one instance, never over itself, its writes
fenced with the run's token."""

# mypy: disable-error-code="untyped-decorator"

from __future__ import annotations

import os
import socket

from celery import current_task, shared_task
from django.utils import timezone

from django_locks import current_lock, on_one_instance, without_overlapping
from django_locks.fencing import fenced_update
from testproject.clients import WarehouseClient
from testproject.inventory.models import Product, Reconciliation


@shared_task(name="inventory.reconcile_stock")
@on_one_instance(key="inventory:reconcile-stock")
@without_overlapping()
def reconcile_stock() -> int:
    lock = current_lock()
    assert lock is not None
    products = list(Product.objects.order_by("sku"))
    counts = WarehouseClient().stock_counts([product.sku for product in products])
    written = 0
    for product in products:
        lock.signal.raise_if_aborted()  # the lock was lost: stop here
        # Written only if no newer run wrote this row: a paused run's late write changes nothing.
        written += fenced_update(
            Product.objects.filter(pk=product.pk),
            lock,
            in_stock=counts[product.sku],
            reconciled_at=timezone.now(),
        )
    Reconciliation.objects.create(
        fencing_token=lock.fencing_token,
        worker=f"{socket.gethostname()}:{os.getpid()}",
        beat=getattr(current_task.request, "django_locks_beat", None) or "",
        written=written,
    )
    return written
