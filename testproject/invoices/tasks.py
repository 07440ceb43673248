"""The nightly export: published by one beat, run by one worker at a time."""

# mypy: disable-error-code="untyped-decorator"

from __future__ import annotations

from celery import current_task, shared_task

from django_locks import current_lock, on_one_instance, without_overlapping
from testproject.invoices import export
from testproject.invoices.export import KEY


@shared_task(name="invoices.export_invoices")
@on_one_instance(key=KEY)
@without_overlapping()
def export_invoices() -> int:
    lock = current_lock()  # the run lock "invoices:nightly-export"; its token grows every run
    assert lock is not None
    request = current_task.request
    return export.export_invoices(
        lock,
        source="beat",
        scheduled=getattr(request, "django_locks_scheduled", None),
        beat=getattr(request, "django_locks_beat", None),
    )
