"""``Lease``: one row per lock key, the table behind ``DatabaseStore``."""

from __future__ import annotations

from django.db import models

TOKEN_SEQUENCE = "django_locks_lease_fencing_token_seq"
"""On PostgreSQL the sequence fencing tokens are drawn from; on SQLite a one-row table of the
same name holds the highest token handed out (see the ``0001_initial`` migration)."""


class Lease(models.Model):
    """A lock key's lease: who holds it, until when (on the database's clock), with which token.

    Rows are written by ``DatabaseStore`` with SQL of its own, on its own connections; they are
    kept after release (``released_at`` set) so that the key's fencing token never goes back.
    Use the ORM on this model for reading (the admin, listings), never to take or free a lock.
    """

    key = models.CharField(max_length=500, primary_key=True)
    owner = models.CharField(max_length=255)
    holder = models.CharField(max_length=255, blank=True, help_text="host:pid of the taker")
    fencing_token = models.BigIntegerField()
    acquired_at = models.DateTimeField()
    expires_at = models.DateTimeField()
    released_at = models.DateTimeField(null=True, blank=True)
    # New in 0.2.0, all nullable (SPEC section 9: a 0.1.0 process shares the table and writes
    # none of them). They describe the lease whose token is `described_token`: a lease taken by
    # a 0.1.0 process (another token) leaves the previous lease's values behind, and they are
    # then read as unknown, never as this lease's.
    holder_kind = models.CharField(max_length=16, null=True, blank=True)
    holder_detail = models.CharField(max_length=500, null=True, blank=True)
    described_token = models.BigIntegerField(null=True, blank=True)
    renewed_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(
        max_length=16,
        null=True,
        blank=True,
        help_text="How the lease ended, or for a lease left to lapse, how it will end",
    )
    ended_by = models.CharField(max_length=255, null=True, blank=True)
    # Also new in 0.2.0, nullable too. A key taken with permits (SPEC section 4): its own row
    # records `permits` (and while any slot is live, is held by the owner "permits"); each slot's
    # row `<key>#<n>` records its `base_key` and `permits` too.
    permits = models.PositiveIntegerField(null=True, blank=True)
    base_key = models.CharField(max_length=500, null=True, blank=True)
    # New in 0.2.0 as well, nullable (migration 0006): a preempt request (SPEC section 12,
    # on_conflict="replace") names the fencing token of the lease it asks to give the key up;
    # only that lease's renewals answer it, so a request left behind by a lease that ended is
    # stale and ignored (an acquire making a new lease clears it). A previous release's process
    # never reads it.
    preempt_token = models.BigIntegerField(null=True, blank=True)
    # New in 0.2.0 as well, nullable (migration 0007): the key's tick record (SPEC section 12,
    # on_one_instance(catch_up=True)), the last tick a beat recorded under its owner lease and
    # that lease's token. Written only by the owner of the row's live plain lease, and by no
    # acquire, renewal or release, so it outlives that lease; deleted with the row by prune().
    # A previous release's process never reads them.
    tick_ms = models.BigIntegerField(
        null=True,
        blank=True,
        help_text="The scheduled time of the last tick recorded, in ms since the Unix epoch (UTC)",
    )
    tick_token = models.BigIntegerField(
        null=True, blank=True, help_text="The fencing token of the lease that recorded the tick"
    )

    class Meta:
        db_table = "django_locks_lease"
        ordering = ["key"]
        verbose_name = "lease"
        verbose_name_plural = "leases"
        default_permissions = ("view",)
        # No index but the primary key, on purpose: every acquire, renewal and release moves
        # expires_at or released_at, and an index on either would make each of those writes
        # update every index (no HOT update): measured, about 10% more server time per acquire
        # and release. The admin's filters scan the table instead (tens of milliseconds at
        # 100,000 rows, as a plain ModelAdmin does).
        permissions = [("release_lease", "Can release a lease held by anyone")]

    def __str__(self) -> str:
        return self.key
