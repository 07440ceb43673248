"""The database store's PostgreSQL SQL: every statement and SQL function, built once at import.

``postgresql.py`` runs them (one method per operation); migrations 0002 and 0003 create the
functions from the texts here (``PG_FUNCTIONS``, ``PG_FUNCTIONS_V3``).
"""

from __future__ import annotations

from django_locks.stores.base import PERMITS_OWNER
from django_locks.stores.database.operations import FUNCTIONS, RECORDER, SEQUENCE, TABLE

CHANNEL = "django_locks_released"
"""The ``NOTIFY`` channel of release notices (``listener.py`` listens on it)."""
LISTEN = f"LISTEN {CHANNEL}"

# Each operation is ONE statement in autocommit: the ownership check sits in the statement's
# WHERE, evaluated on the row version the statement has locked, and every time is the server's
# clock_timestamp() (not now(): a statement that waited for a row lock must judge expiry after
# the wait). No session state, no server-side prepared statements, no advisory locks: all of it
# works behind PgBouncer in transaction pooling mode.
_LIVE = "lease.released_at IS NULL AND lease.expires_at > clock_timestamp()"


def _expiry(ttl_ms: str) -> str:
    return f"clock_timestamp() + {ttl_ms} * interval '1 millisecond'"


# ON CONFLICT DO UPDATE locks the existing row first, then evaluates WHERE and SET on it, so the
# nextval() in SET is drawn after the row lock and floored by the row's own token: a sequence
# restored from a backup or reset on a failed-over server never hands a key an old token. (The
# nextval() in VALUES is evaluated before the conflict is known; for an existing key that value
# is simply skipped.) The same owner holding a live lease gets its token back and its lease
# extended: a retry after a timeout never strands the lease.
def _acquire(key: str, owner: str, holder: str, ttl_ms: str) -> str:
    return f"""
INSERT INTO {TABLE} AS lease
    (key, owner, holder, fencing_token, acquired_at, expires_at, released_at)
VALUES ({key}, {owner}, {holder}, nextval('{SEQUENCE}'), clock_timestamp(), {_expiry(ttl_ms)},
    NULL)
ON CONFLICT (key) DO UPDATE SET
    fencing_token = CASE WHEN lease.owner = excluded.owner AND {_LIVE}
        THEN lease.fencing_token
        ELSE greatest(nextval('{SEQUENCE}'), lease.fencing_token + 1) END,
    acquired_at = CASE WHEN lease.owner = excluded.owner AND {_LIVE}
        THEN lease.acquired_at ELSE clock_timestamp() END,
    owner = excluded.owner,
    holder = excluded.holder,
    expires_at = {_expiry(ttl_ms)},
    released_at = NULL
WHERE lease.owner = excluded.owner OR NOT ({_LIVE})
RETURNING lease.fencing_token"""


_FREE = f"""
UPDATE {TABLE} AS lease
SET released_at = clock_timestamp(), expires_at = least(lease.expires_at, clock_timestamp())
WHERE {_LIVE}"""

# Acquire and release, the two calls on a caller's path, are also SQL functions (created by the
# 0002 migration from the statements above): PL/pgSQL plans its statements once per session, so
# a call costs the server a short SELECT to parse instead of the whole statement, prepared
# statements or not, behind PgBouncer too. Until the migration ran, the store sends the
# statements themselves. A change to a statement needs a migration re-creating the functions.
#
# The release commits without waiting for its WAL flush (synchronous_commit off, for its own
# transaction): the freed lease is visible at once, and any later commit that waits for the disk
# (the next holder's acquire, say) flushes it too. Only a server crash before such a commit can
# lose it: the lease then comes back with its old owner, which nobody renews, and lapses at its
# ttl, as after a crash of its holder. Acquire and renew wait for the flush: a lost one could
# hand a token out twice, or end a lease before its holder's deadline. (The SQL comment in the
# release's body still names stores/database.py, this module's old name: the functions' text
# stays exactly what migration 0002 created.)
PG_FUNCTIONS = f"""
CREATE OR REPLACE FUNCTION django_locks_acquire(p_key text, p_owner text, p_holder text,
    p_ttl_ms bigint) RETURNS bigint LANGUAGE plpgsql AS $body$
DECLARE
    token bigint;
BEGIN
    {_acquire("p_key", "p_owner", "p_holder", "p_ttl_ms")} INTO token;
    RETURN token;
END
$body$;
CREATE OR REPLACE FUNCTION django_locks_release(p_key text, p_owner text) RETURNS boolean
LANGUAGE plpgsql AS $body$
BEGIN
    {_FREE} AND lease.key = p_key AND lease.owner = p_owner;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_notify('{CHANNEL}', p_key);
    -- This transaction only: a release need not wait for the disk (see stores/database.py).
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN true;
END
$body$;
"""
PG_DROP_FUNCTIONS = """
DROP FUNCTION IF EXISTS django_locks_acquire(text, text, text, bigint);
DROP FUNCTION IF EXISTS django_locks_release(text, text);
"""
# Migration 0003's functions, under new names (SPEC section 9): 0.1.0 processes keep calling
# 0002's, unchanged, during a rolling upgrade, and this release calls only these. Besides what
# 0002's acquire writes, an acquire records the holder's kind and detail, and which lease they
# describe (``described_token``, the new token: a 0.1.0 process's acquire leaves the previous
# lease's values behind with another token, and readers then take them as unknown); it clears
# the last renewal and any end record. A new lease's token is drawn once and written to both
# columns (two nextval() calls would differ): in VALUES through a sub-SELECT, in SET through a
# row assignment from one, still evaluated after the row lock.
_SAME = f"lease.owner = excluded.owner AND {_LIVE}"
_DESCRIBED = "lease.described_token = lease.fencing_token"


def _acquire_as(key: str, owner: str, holder: str, kind: str, detail: str, ttl_ms: str) -> str:
    return f"""
INSERT INTO {TABLE} AS lease
    (key, owner, holder, fencing_token, acquired_at, expires_at, released_at, holder_kind,
    holder_detail, described_token, renewed_at, end_reason, ended_by)
SELECT {key}, {owner}, {holder}, drawn.token, clock_timestamp(), {_expiry(ttl_ms)}, NULL,
    {kind}, {detail}, drawn.token, NULL, NULL, NULL
FROM (SELECT nextval('{SEQUENCE}') AS token) AS drawn
ON CONFLICT (key) DO UPDATE SET
    (fencing_token, described_token) = (SELECT chosen.token, chosen.token FROM (SELECT
        CASE WHEN {_SAME} THEN lease.fencing_token
        ELSE greatest(nextval('{SEQUENCE}'), lease.fencing_token + 1) END AS token) AS chosen),
    acquired_at = CASE WHEN {_SAME} THEN lease.acquired_at ELSE clock_timestamp() END,
    renewed_at = CASE WHEN {_SAME} THEN lease.renewed_at END,
    owner = excluded.owner,
    holder = excluded.holder,
    holder_kind = excluded.holder_kind,
    holder_detail = excluded.holder_detail,
    expires_at = {_expiry(ttl_ms)},
    released_at = NULL,
    end_reason = NULL,
    ended_by = NULL
WHERE lease.owner = excluded.owner OR NOT ({_LIVE})
RETURNING lease.fencing_token"""


# Times leave the server as UTC without a zone: the same datetimes whatever the session's
# TimeZone and the driver's loaders (USE_TZ or not).
def _utc(column: str) -> str:
    return f"{column} AT TIME ZONE 'UTC'"


# A lease ends recording how and by whom. A lease a 0.1.0 process took (other token) is
# described from here on as what is known of it: no kind, detail or renewal, this end.
def _end(how: str, by: str) -> str:
    return f"""
UPDATE {TABLE} AS lease
SET released_at = clock_timestamp(), expires_at = least(lease.expires_at, clock_timestamp()),
    end_reason = {how}, ended_by = {by},
    holder_kind = CASE WHEN {_DESCRIBED} THEN lease.holder_kind END,
    holder_detail = CASE WHEN {_DESCRIBED} THEN lease.holder_detail END,
    renewed_at = CASE WHEN {_DESCRIBED} THEN lease.renewed_at END,
    described_token = lease.fencing_token
WHERE {_LIVE}"""


# A failed acquire answers with the holder in the same call: the upsert's ON CONFLICT DO UPDATE
# locked the row even though its WHERE refused it, so the SELECT after it (a new snapshot, in
# the same transaction) reads the very lease that refused this caller, nothing committed since.
# The release's twin records how the lease ended, with the same notice and commit as 0002's.
PG_FUNCTIONS_V3 = f"""
CREATE OR REPLACE FUNCTION django_locks_acquire_as(p_key text, p_owner text, p_holder text,
    p_kind text, p_detail text, p_ttl_ms bigint, OUT taken bigint, OUT held_by text,
    OUT held_kind text, OUT held_detail text, OUT held_since timestamp,
    OUT held_until timestamp) LANGUAGE plpgsql AS $body$
BEGIN
    {_acquire_as("p_key", "p_owner", "p_holder", "p_kind", "p_detail", "p_ttl_ms")} INTO taken;
    IF taken IS NULL THEN
        SELECT lease.holder, CASE WHEN {_DESCRIBED} THEN lease.holder_kind END,
            CASE WHEN {_DESCRIBED} THEN lease.holder_detail END, {_utc("lease.acquired_at")},
            {_utc("lease.expires_at")}
        INTO held_by, held_kind, held_detail, held_since, held_until
        FROM {TABLE} AS lease WHERE lease.key = p_key;
    END IF;
END
$body$;
CREATE OR REPLACE FUNCTION django_locks_end(p_key text, p_owner text, p_how text)
RETURNS boolean LANGUAGE plpgsql AS $body$
BEGIN
    {_end("p_how", "NULL")} AND lease.key = p_key AND lease.owner = p_owner;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    PERFORM pg_notify('{CHANNEL}', p_key);
    -- This transaction only: a release need not wait for the disk (see postgresql.py).
    PERFORM set_config('synchronous_commit', 'off', true);
    RETURN true;
END
$body$;
"""
PG_DROP_FUNCTIONS_V3 = """
DROP FUNCTION IF EXISTS django_locks_acquire_as(text, text, text, text, text, bigint);
DROP FUNCTION IF EXISTS django_locks_end(text, text, text);
"""
# The ttl is cast: an int too large for a bigint is then an error of its own, not a call of a
# function the database does not have (which would turn the functions off for the process).
PG_ACQUIRE_AS_CALL = "SELECT * FROM django_locks_acquire_as(%s, %s, %s, %s, %s, %s::bigint)"
PG_END_CALL = "SELECT django_locks_end(%s, %s, %s)"
# Without the functions (a restored dump): the statements themselves, a failed acquire then
# answering without its holder (a second SELECT in the statement would read its snapshot, which
# may predate the lease that refused it).
PG_ACQUIRE_AS = _acquire_as(
    "%(key)s", "%(owner)s", "%(holder)s", "%(kind)s", "%(detail)s", "%(ttl)s"
)
PG_RENEW = f"""
UPDATE {TABLE} AS lease
SET expires_at = {_expiry("%s")}, renewed_at = clock_timestamp(), end_reason = NULL
WHERE lease.key = %s AND lease.owner = %s AND {_LIVE}
"""
# Every lock a process holds on this database, renewed in one statement: each row is checked
# and moved exactly as PG_RENEW does, and the rows renewed come back.
PG_RENEW_MANY = f"""
UPDATE {TABLE} AS lease
SET expires_at = clock_timestamp() + batch.ttl * interval '1 millisecond',
    renewed_at = clock_timestamp(), end_reason = NULL
FROM unnest(%s::text[], %s::text[], %s::bigint[]) AS batch (key, owner, ttl)
WHERE lease.key = batch.key AND lease.owner = batch.owner AND {_LIVE}
RETURNING lease.key, lease.owner
"""
# Renewed once more, never again: how it ends once it runs out is recorded now.
PG_LEAVE = f"""
UPDATE {TABLE} AS lease SET expires_at = {_expiry("%s")}, end_reason = %s
WHERE lease.key = %s AND lease.owner = %s AND {_LIVE}
"""

# Tick records (migration 0007): the owner of the key's live plain lease (never a permit's slot,
# whose row names its base, nor a key's own record under permits) records a tick with that
# lease's token, judged as PG_RENEW judges (_LIVE, on the row the UPDATE locked). No other
# statement or function writes the two columns: every acquire's upsert names the columns it
# sets, so the record outlives the lease and the acquires of other owners.
PG_RECORD_TICK = f"""
UPDATE {TABLE} AS lease SET tick_ms = %s::bigint, tick_token = lease.fencing_token
WHERE lease.key = %s AND lease.owner = %s AND lease.owner <> '{PERMITS_OWNER}'
    AND lease.base_key IS NULL AND {_LIVE}
"""
PG_RECORDED_TICK = f"""
SELECT tick_ms, tick_token FROM {TABLE}
WHERE key = %s AND tick_ms IS NOT NULL AND tick_token IS NOT NULL
"""
# The testing reset (clear()) removes every record, after freeing every lease.
PG_CLEAR_TICKS = f"""
UPDATE {TABLE} SET tick_ms = NULL, tick_token = NULL
WHERE tick_ms IS NOT NULL OR tick_token IS NOT NULL"""


def _notifying(update: str) -> str:
    # The release and its notice are one statement: waiters hear of every release (delivered at
    # commit), and the statement's row count is still the number of leases freed.
    return (
        f"WITH freed AS ({update} RETURNING lease.key) "
        f"SELECT pg_notify('{CHANNEL}', freed.key) FROM freed"
    )


PG_END = _notifying(_end("%s", "NULL") + " AND lease.key = %s AND lease.owner = %s")
PG_FORCE_END = _notifying(_end("'force released'", "%s") + " AND lease.key = %s")
PG_CLEAR = _notifying(_end("'force released'", "'locks.clear()'"))
# Testing aid (LockStore.warp): every live lease's expiry moved earlier, as if time had passed.
PG_WARP = f"""
UPDATE {TABLE} AS lease SET expires_at = lease.expires_at - %s * interval '1 millisecond'
WHERE {_LIVE}"""
PG_LEASES = f"""
SELECT lease.key, lease.owner, lease.holder, lease.fencing_token, {_utc("lease.acquired_at")},
    CASE WHEN lease.released_at IS NOT NULL THEN 'released'
         WHEN lease.expires_at > clock.now THEN 'held' ELSE 'expired' END,
    (extract(epoch FROM lease.expires_at - clock.now) * 1000)::bigint,
    {_utc("lease.expires_at")}, coalesce({_DESCRIBED}, false), lease.holder_kind,
    lease.holder_detail, {_utc("lease.renewed_at")}, lease.end_reason, lease.ended_by,
    CASE WHEN lease.base_key IS NOT NULL
        THEN substr(lease.key, length(lease.base_key) + 2)::integer END,
    CASE WHEN lease.base_key IS NOT NULL OR lease.owner = '{PERMITS_OWNER}' THEN lease.permits END
FROM {TABLE} AS lease, (SELECT clock_timestamp() AS now) AS clock
"""
# The last two: a slot's permit (its row names its base) and the permits of a slot or of a
# key's own record while the permits' owner holds it (a previous release's plain acquire may
# have taken it since, leaving the column behind).
_HELD = "lease.released_at IS NULL AND lease.expires_at > clock.now"
PG_LEASES_HELD = f"{PG_LEASES} WHERE {_HELD}"
PG_LEASE = f"{PG_LEASES} WHERE lease.key = %s"
PG_LEASE_HELD = f"{PG_LEASE} AND {_HELD}"

# Pruning deletes rows whose key then starts over from the sequence alone, without the row's own
# token as a floor. So each batch first raises the sequence to the batch's highest token, while
# holding a lock that keeps every acquire out until the rows are gone: an acquire that drew its
# token before the raise and then inserted the pruned key would otherwise hand out an old token
# (after a sequence reset, the rows are ahead of the sequence). SHARE ROW EXCLUSIVE conflicts
# with the ROW EXCLUSIVE lock an INSERT / UPDATE takes before it evaluates anything.
_STALE = "expires_at < clock_timestamp() - %s * interval '1 millisecond'"
# The batch holds the table lock, which every acquire and renewal waits on: a pruner stopped in
# the middle of one (SIGSTOP, a debugger) is disconnected by the server after PRUNE_IDLE of
# idleness and its batch rolled back, instead of holding every key until it resumes.
PRUNE_IDLE = "2s"
PG_PRUNE_GUARD = f"SET LOCAL idle_in_transaction_session_timeout = '{PRUNE_IDLE}'"
PG_PRUNE_LOCK = f"LOCK TABLE {TABLE} IN SHARE ROW EXCLUSIVE MODE"
PG_PRUNE_BATCH = f"SELECT key, fencing_token FROM {TABLE} WHERE {_STALE} LIMIT %s"
PG_PRUNE_FLOOR = f"""
SELECT setval('{SEQUENCE}', greatest((SELECT last_value FROM {SEQUENCE}), %s))
"""
# A row another transaction has locked is left for the next prune: a permit's acquire locks its
# key's own row (which may have ended long ago) before it writes, and that write waits for the
# table lock held here, so waiting for the row would be a deadlock.
PG_PRUNE_DELETE = f"""
DELETE FROM {TABLE} WHERE key IN (SELECT key FROM {TABLE} WHERE key = ANY(%s) AND {_STALE}
    FOR UPDATE SKIP LOCKED)"""
PG_PRUNE_COUNT = f"SELECT count(*) FROM {TABLE} WHERE {_STALE}"
# One key prefix's rows alone (LOCKS["KEY_PREFIX"], of Locks.prune()): its length, then itself.
# Compared exactly (LIKE would take the prefix's % and _ for wildcards).
_PREFIXED = "left(key, %s) = %s"
PG_PRUNE_BATCH_PREFIXED = (
    f"SELECT key, fencing_token FROM {TABLE} WHERE {_STALE} AND {_PREFIXED} LIMIT %s"
)
PG_PRUNE_COUNT_PREFIXED = f"SELECT count(*) FROM {TABLE} WHERE {_STALE} AND {_PREFIXED}"

SIGNATURES = [signature for signatures in FUNCTIONS.values() for signature in signatures]
PG_MISSING = (
    f"SELECT to_regclass('{TABLE}') IS NULL, to_regclass('{SEQUENCE}') IS NULL, "
    f"to_regclass('{RECORDER}'), ARRAY(SELECT attname::text FROM pg_attribute "
    f"WHERE attrelid = to_regclass('{TABLE}') AND attnum > 0 AND NOT attisdropped), "
    + ", ".join(f"to_regprocedure('{signature}') IS NULL" for signature in SIGNATURES)
)
