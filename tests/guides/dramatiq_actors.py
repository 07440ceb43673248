# myproject/actors.py
"""Dramatiq actors that never run twice at once for one account, whichever workers take them."""

from __future__ import annotations

import dramatiq

from django_locks import LockNotAcquiredError, without_overlapping


def sync_account(account_id: int) -> None:
    """The work itself: bring one account up to date with the billing provider."""


@dramatiq.actor
@without_overlapping("accounts:sync:{account_id}")
def sync_account_actor(account_id: int) -> None:
    """A message that finds a sync of its account running is done (skipped)."""
    sync_account(account_id)


@without_overlapping("accounts:sync-each:{account_id}", on_conflict="raise")
def sync_account_now(account_id: int) -> None:
    sync_account(account_id)


@dramatiq.actor(max_retries=20, min_backoff=200, max_backoff=2_000)
def sync_account_each_time(account_id: int) -> None:
    """Every message runs, one at a time: one that finds a sync running comes back later."""
    try:
        sync_account_now(account_id)
    except LockNotAcquiredError as exc:
        raise dramatiq.Retry(str(exc)) from exc  # retried with backoff, not logged as an error
