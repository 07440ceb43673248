"""The invoice export, shared by the nightly task and the admin's "export now"."""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from django.utils import timezone

from django_locks import Lock
from django_locks.fencing import fenced_update
from testproject.clients import AccountingClient
from testproject.invoices.models import Invoice

logger = logging.getLogger("shop")

KEY = "invoices:nightly-export"
"""The export's lock: the nightly task and the admin view share it, so they never overlap."""


def export_invoices(lock: Lock, **run: Any) -> int:
    """Send the invoices not exported yet to accounting, then mark them exported under ``lock``'s
    fencing token; return how many were sent. ``run`` describes the run for accounting's log."""
    pending = list(Invoice.objects.filter(exported_at=None).order_by("pk"))
    batch = [{"number": invoice.number, "amount": str(invoice.amount)} for invoice in pending]
    AccountingClient().send_invoices(
        batch,
        worker=f"{socket.gethostname()}:{os.getpid()}",
        fencing_token=lock.fencing_token,
        **run,
    )
    # One UPDATE, refused for every row a newer run already marked.
    marked = fenced_update(
        Invoice.objects.filter(pk__in=[invoice.pk for invoice in pending]),
        lock,
        exported_at=timezone.now(),
    )
    logger.info("Exported %d invoices (fencing token %s)", marked, lock.fencing_token)
    return len(batch)
