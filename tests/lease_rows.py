"""``Lease`` rows written straight into the database store's table, for the admin's tests and
benchmark: one row per state (as the stores write them), and many ended rows in one statement."""

from __future__ import annotations

import datetime

from django.db import connections
from django.utils import timezone

from django_locks.models import Lease

OWNER = "owner-secret"
LONG_DETAIL = "nightly-export-" + "x" * 60


def put(
    key: str,
    *,
    token: int,
    ended: str | None = None,
    reason: str | None = None,
    by: str | None = None,
    described: bool = True,
    holder: str = "web-2:4121",
    kind: str = "web",
    detail: str = "",
    minutes: float = 0,
    now: datetime.datetime | None = None,
    using: str = "default",
) -> None:
    """A lease row: held (``ended=None``, expiring ``minutes`` + 10 from now), or ended by
    ``"release"`` or ``"expiry"`` ``minutes`` ago; ``described=False`` for a lease a 0.1.0
    process took after a described one (the new columns then describe another token).
    ``now``: the moment the times count from (default: now, when the row is written)."""
    now = now if now is not None else timezone.now()
    at = now - datetime.timedelta(minutes=minutes)
    expires = now + datetime.timedelta(minutes=10 + minutes) if ended is None else at
    Lease.objects.using(using).create(
        key=key,
        owner=f"{OWNER}-{token}",
        holder=holder,
        fencing_token=token,
        acquired_at=at - datetime.timedelta(minutes=5),
        expires_at=expires,
        released_at=at if ended == "release" else None,
        holder_kind=kind,
        holder_detail=detail,
        described_token=token if described else token - 1,
        renewed_at=at - datetime.timedelta(seconds=20),
        end_reason=reason,
        ended_by=by,
    )


EXPECTED = {
    "held:export": "held",
    "held:old-process": "held",
    "expired:crash": "expired",
    "lapsed:min-hold": "lapsed",
    "handed-back:grace": "handed back",
    "expired:old-process": "expired",
    "max-hold:stuck": "max hold",
    "released:clean": "released",
    "handed-back:shutdown": "handed back",
    "force-released:alice": "force released",
    "released:old-process": "released",
    "released:old-force": "released",
}
"""The rows of :func:`put_every_state`: key -> the state the page shows, in the page's
default order (held first, latest expiry first; then expired, then released, most recent
first)."""


def put_every_state(using: str = "default") -> None:
    """One row per state, and the rows a 0.1.0 process leaves (stale reasons it did not clear)."""
    put("held:export", token=11, kind="worker", detail=LONG_DETAIL, minutes=5, using=using)
    put("held:old-process", token=12, described=False, reason="lapsed", using=using)
    put("expired:crash", token=21, ended="expiry", minutes=1, using=using)
    put("lapsed:min-hold", token=22, ended="expiry", reason="lapsed", kind="command", minutes=2,
        using=using)  # fmt: skip
    put("handed-back:grace", token=23, ended="expiry", reason="handed back", kind="beat",
        minutes=3, using=using)  # fmt: skip
    put("expired:old-process", token=24, ended="expiry", described=False, reason="lapsed",
        minutes=4, using=using)  # fmt: skip
    put("max-hold:stuck", token=25, ended="expiry", reason="max hold", minutes=5, using=using)
    put("released:clean", token=31, ended="release", reason="released", minutes=1, using=using)
    put("handed-back:shutdown", token=32, ended="release", reason="handed back", minutes=2,
        using=using)  # fmt: skip
    put("force-released:alice", token=33, ended="release", reason="force released",
        by="admin alice", minutes=3, using=using)  # fmt: skip
    put("released:old-process", token=34, ended="release", described=False,
        reason="force released", minutes=4, using=using)  # fmt: skip
    # A lease left to lapse, then freed by a 0.1.0 process's force release: no reason of its own.
    put("released:old-force", token=35, ended="release", reason="lapsed", minutes=5, using=using)


# Many rows at once, on PostgreSQL: one INSERT ... SELECT over generate_series. Row i ended i
# seconds ago, a quarter each released, handed back (released), lapsed and crashed (expired);
# the held ones expire in 10 to 20 minutes. Tokens come from the store's own sequence.
_FILL = """
INSERT INTO django_locks_lease AS lease (key, owner, holder, fencing_token, acquired_at,
    expires_at, released_at, holder_kind, holder_detail, described_token, renewed_at,
    end_reason, ended_by)
SELECT %(prefix)s || i, 'owner-secret-' || i, 'worker-' || (i %% 7) || ':' || (1000 + i %% 50),
    t, ended - interval '5 minutes', ended, CASE WHEN i %% 4 < 2 THEN ended END,
    'worker', 'task-' || i, t, ended - interval '20 seconds',
    CASE i %% 4 WHEN 0 THEN 'released' WHEN 1 THEN 'handed back' WHEN 2 THEN 'lapsed' END, NULL
FROM (SELECT i, nextval('django_locks_lease_fencing_token_seq') AS t,
             clock_timestamp() - i * interval '1 second' AS ended
      FROM generate_series(1, %(ended)s) AS i) AS rows
"""
_HELD = """
INSERT INTO django_locks_lease (key, owner, holder, fencing_token, acquired_at, expires_at,
    released_at, holder_kind, holder_detail, described_token, renewed_at)
SELECT %(prefix)s || i, 'owner-secret-held-' || i, 'web-' || (i %% 3) || ':' || (2000 + i),
    t, clock_timestamp() - interval '1 minute', clock_timestamp() + (600 + i * 6) * interval
    '1 second', NULL, 'command', 'nightly_export', t, clock_timestamp()
FROM (SELECT i, nextval('django_locks_lease_fencing_token_seq') AS t
      FROM generate_series(1, %(held)s) AS i) AS rows
"""


def fill(using: str, *, ended: int, held: int = 0, prefix: str = "report:") -> None:
    """``ended`` ended rows (``report:1``, ...) and ``held`` held ones (``<prefix>held:1``, ...)
    in two statements on the PostgreSQL alias ``using``, then ``ANALYZE`` (as autovacuum would
    soon after such a load)."""
    with connections[using].cursor() as cursor:
        cursor.execute(_FILL, {"prefix": prefix, "ended": ended})
        cursor.execute(_HELD, {"prefix": f"{prefix}held:", "held": held})
        cursor.execute("ANALYZE django_locks_lease")


def explain(using: str, sql: str) -> str:
    """PostgreSQL's plan of ``sql`` (a query as Django ran it, its parameters in it)."""
    with connections[using].cursor() as cursor:
        cursor.execute(f"EXPLAIN {sql}")
        return "\n".join(row[0] for row in cursor.fetchall())
