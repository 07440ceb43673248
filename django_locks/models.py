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

    class Meta:
        db_table = "django_locks_lease"
        ordering = ["key"]
        verbose_name = "lease"
        verbose_name_plural = "leases"
        permissions = [("release_lease", "Can release a lease held by anyone")]

    def __str__(self) -> str:
        return self.key
