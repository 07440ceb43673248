"""The database store's PostgreSQL SQL for preempt requests: migration 0006's functions and calls.

A preempt request (SPEC section 12, what ``on_conflict="replace"`` writes) is the lease row's
``preempt_token``: the fencing token of the lease asked to give its key up. Only that lease's
renewals answer it, so a request left behind on the row by a lease that ended names another
token and is ignored; an acquire making a new lease on the row clears it anyway, and the same
owner's idempotent acquire (the same lease) keeps it. A preempted renewal writes the row as it
was: the lease is not extended, and lapses at its expiry unless its holder releases it sooner.

Functions with new names (SPEC section 9): 0002's, 0003's and 0005's stay, unchanged, for the
processes of previous releases, whose renewals know no requests (they renew a preempted lease:
a previous release's run is never preempted, see docs/howto/upgrade.rst). The acquires are
0005's, from the same texts, with the request written by the same upsert; the renewals are the
statements this module's callers sent before, answering per lease whether it was preempted.
"""

from __future__ import annotations

from django_locks.stores.database.operations import TABLE
from django_locks.stores.database.postgresql_permits_sql import (
    _GENERIC,
    _OWNER,
    _acquire_permit,
    _acquire_plain,
    _slots,
)
from django_locks.stores.database.postgresql_sql import _LIVE, _SAME

# Whether the row's lease carries a request naming its own token (NULL: no request at all).
_ASKED = "lease.preempt_token IS NOT DISTINCT FROM lease.fencing_token"

# 0005's plain acquire, the request kept only by the same owner's live lease (the CASE reads
# the row as it was, like every other expression of the SET).
_ACQUIRE_LEASE = _acquire_plain(
    "django_locks_acquire_lease",
    f""",
        preempt_token = CASE WHEN {_SAME} THEN lease.preempt_token END""",
)
# 0005's permit acquire: a slot's upsert always makes a new lease (it takes only a slot no live
# lease holds), so it clears the slot's request; the owner's own live slot, extended by the
# function's other UPDATE, keeps it.
_ACQUIRE_SLOT = _acquire_permit(
    "django_locks_acquire_slot",
    """,
                preempt_token = NULL""",
)


def _renewal(ttl: str) -> str:
    """The SET of a renewal: the lease moved to ``ttl`` ms from now and its renewal recorded
    (a leave's end record cleared), unless it is asked to give the key up: then as it was."""
    return f"""
    expires_at = CASE WHEN {_ASKED} THEN lease.expires_at
        ELSE clock_timestamp() + {ttl} * interval '1 millisecond' END,
    renewed_at = CASE WHEN {_ASKED} THEN lease.renewed_at ELSE clock_timestamp() END,
    end_reason = CASE WHEN {_ASKED} THEN lease.end_reason END"""


# One renewal (PG_RENEW, answering): NULL when the owner holds no live lease on the key, else
# whether it is preempted (false: renewed). The ownership and expiry check is the UPDATE's WHERE,
# evaluated on the row it locked; RETURNING reads the row it wrote, whose tokens the SET keeps.
_RENEW = f"""
CREATE OR REPLACE FUNCTION django_locks_renew(p_key text, p_owner text, p_ttl_ms bigint)
RETURNS boolean LANGUAGE plpgsql AS $body$
DECLARE
    v_preempted boolean;
BEGIN
    UPDATE {TABLE} AS lease SET {_renewal("p_ttl_ms")}
    WHERE lease.key = p_key AND lease.owner = p_owner AND {_LIVE}
    RETURNING {_ASKED} INTO v_preempted;  -- on the key's index, whatever the plan
    RETURN v_preempted;
END
$body$;
"""

# Every lock a process holds on this database in one statement (PG_RENEW_MANY, answering):
# each row checked and moved (or, preempted, left) exactly as django_locks_renew does; the
# leases it found come back, each with whether it is preempted. A statement, planned for the
# batch it is sent with: a function's cached generic plan estimates any unnest() at 10 rows, and
# on a table whose statistics were still those of an empty one it joined a batch of 1,000 to a
# sequential scan per lease (787 ms, against 17 ms planned for the batch; measured once).
PG_RENEW_BATCH = f"""
UPDATE {TABLE} AS lease SET {_renewal("batch.ttl")}
FROM unnest(%s::text[], %s::text[], %s::bigint[]) AS batch (key, owner, ttl)
WHERE lease.key = batch.key AND lease.owner = batch.owner AND {_LIVE}
RETURNING lease.key, lease.owner, {_ASKED}
"""

# 0005's django_locks_renew_slots for renewals (leaves still call 0005's), answering: the bases
# first, in key order; each base moved to at least the latest expiry of its slots renewed (a
# preempted slot, not moved, moves nothing).
_RENEW_PERMITS = f"""
CREATE OR REPLACE FUNCTION django_locks_renew_permits(p_keys text[], p_owners text[],
    p_ttls bigint[], p_bases text[])
    RETURNS TABLE (renewed_key text, renewed_owner text, preempted boolean)
    LANGUAGE plpgsql AS $body$
BEGIN
    PERFORM 1 FROM {TABLE} AS lease WHERE lease.key = ANY(p_bases) AND {_LIVE}
        ORDER BY lease.key FOR NO KEY UPDATE;
    RETURN QUERY WITH renewed AS (
        UPDATE {TABLE} AS lease SET {_renewal("batch.ttl")}
        FROM unnest(p_keys, p_owners, p_ttls, p_bases) AS batch (key, owner, ttl, base)
        WHERE lease.key = batch.key AND lease.owner = batch.owner AND {_LIVE}
        RETURNING lease.key, lease.owner, batch.base, lease.expires_at, {_ASKED} AS asked
    ), moved AS (
        UPDATE {TABLE} AS lease
        SET expires_at = greatest(lease.expires_at, latest.expires_at),
            renewed_at = clock_timestamp()
        FROM (SELECT renewed.base, max(renewed.expires_at) AS expires_at FROM renewed
            WHERE renewed.base IS NOT NULL AND NOT renewed.asked GROUP BY renewed.base)
            AS latest
        WHERE lease.key = latest.base AND lease.owner = {_OWNER} AND {_LIVE}
    )
    SELECT renewed.key::text, renewed.owner::text, renewed.asked FROM renewed;
END
$body$;
"""

# The request itself: the key's row locked first (as every function touching a key held by
# permits does, so a slot's acquire, end or renewal cannot move under it), then judged. A plain
# lease (or a slot's own key) gets the request naming its token; a key held by permits, on its
# live slot with the lowest token (the oldest holder). NULL, nothing written, when no live lease
# holds the key. On a generic plan, as 0005's functions reading slots (_GENERIC).
_PREEMPT = f"""
CREATE OR REPLACE FUNCTION django_locks_preempt(p_key text) RETURNS bigint
LANGUAGE plpgsql {_GENERIC} AS $body$
DECLARE
    v_row record;
    v_slots text[];
    v_token bigint;
BEGIN
    SELECT lease.owner, lease.permits, lease.base_key, lease.expires_at, lease.released_at
    INTO v_row FROM {TABLE} AS lease WHERE lease.key = p_key FOR NO KEY UPDATE;
    -- Judged now, once the lock is ours.
    IF NOT FOUND OR v_row.released_at IS NOT NULL OR v_row.expires_at <= clock_timestamp()
    THEN
        RETURN NULL;
    END IF;
    IF v_row.owner = {_OWNER} AND v_row.permits IS NOT NULL AND v_row.base_key IS NULL THEN
        v_slots := {_slots("p_key", "v_row.permits")};
        UPDATE {TABLE} AS asked SET preempt_token = asked.fencing_token
        WHERE asked.key = (SELECT lease.key FROM {TABLE} AS lease
            WHERE lease.key = ANY(v_slots) AND {_LIVE} ORDER BY lease.fencing_token LIMIT 1)
        RETURNING asked.fencing_token INTO v_token;
    ELSE
        UPDATE {TABLE} AS asked SET preempt_token = asked.fencing_token
        WHERE asked.key = p_key
        RETURNING asked.fencing_token INTO v_token;
    END IF;
    RETURN v_token;
END
$body$;
"""

PG_FUNCTIONS_V6 = _ACQUIRE_LEASE + _ACQUIRE_SLOT + _RENEW + _RENEW_PERMITS + _PREEMPT
"""Migration 0006's functions (``CREATE OR REPLACE``)."""
PG_DROP_FUNCTIONS_V6 = """
DROP FUNCTION IF EXISTS django_locks_preempt(text);
DROP FUNCTION IF EXISTS django_locks_renew_permits(text[], text[], bigint[], text[]);
DROP FUNCTION IF EXISTS django_locks_renew(text, text, bigint);
DROP FUNCTION IF EXISTS django_locks_acquire_slot(text, text, text, text, text, bigint, integer);
DROP FUNCTION IF EXISTS django_locks_acquire_lease(text, text, text, text, text, bigint);
"""

# The calls. Numbers are cast (see PG_ACQUIRE_AS_CALL): an int out of range is an error of its
# own, never a call of a function the database lacks.
PG_ACQUIRE_LEASE_CALL = "SELECT * FROM django_locks_acquire_lease(%s, %s, %s, %s, %s, %s::bigint)"
PG_ACQUIRE_SLOT_CALL = (
    "SELECT * FROM django_locks_acquire_slot(%s, %s, %s, %s, %s, %s::bigint, %s::integer)"
)
PG_RENEW_CALL = "SELECT django_locks_renew(%s, %s, %s::bigint)"
PG_RENEW_PERMITS_CALL = (
    "SELECT * FROM django_locks_renew_permits(%s::text[], %s::text[], %s::bigint[], %s::text[])"
)
PG_PREEMPT_CALL = "SELECT django_locks_preempt(%s)"
