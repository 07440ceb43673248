# myproject/tasks.py
"""Huey tasks (huey.contrib.djhuey) that never run twice at once, whichever consumers take them."""

from __future__ import annotations

from huey import crontab
from huey.contrib.djhuey import periodic_task, task

from django_locks import without_overlapping


def import_catalog(supplier: str) -> None:
    """The work itself: a slow import of one supplier's catalog."""


@task(retries=3, retry_delay=30)
@without_overlapping("catalog:import:{supplier}")
def import_catalog_task(supplier: str) -> None:
    import_catalog(supplier)


def send_digest() -> None:
    """The work itself: the digest due every minute."""


@periodic_task(crontab())  # every minute, enqueued by each consumer that runs the scheduler
@without_overlapping("digest:send")
def send_digest_task() -> None:
    send_digest()
