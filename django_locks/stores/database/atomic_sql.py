"""The SQL of ``lock.atomic()`` (SPEC section 13), run on the block's own connection (Django's,
on the store's alias), with Django's ``%s`` placeholders: a block adds one statement at its
start and one before its COMMIT, never a commit of its own (``django_locks/atomic.py``).

PostgreSQL: the block's first statement writes one row of the guard table and sets, for its
transaction only, ``statement_timeout`` and ``idle_in_transaction_session_timeout`` to the
lock's ttl, so a holder stalled anywhere in the block loses its session (and every row lock it
took) within one ttl. The check runs *inside* COMMIT: a ``DEFERRABLE INITIALLY DEFERRED``
constraint trigger on that row finds the lease still this owner's, with this token, live on the
server's clock, and locks it ``FOR SHARE`` until the commit ends; a next holder's acquire (an
``INSERT ... ON CONFLICT DO UPDATE``, which locks the row ``FOR NO KEY UPDATE``) and every
renewal wait for that lock. No client pause can fall between the check and the commit. The
trigger removes its row: the table stays empty. Migration 0008 creates the three.

SQLite: the block holds the file's write lock from its start (``transaction_mode``
``IMMEDIATE``); its last statement is one ``UPDATE`` that checks the lease and extends it.
"""

from __future__ import annotations

from django_locks.stores.database.operations import TABLE

GUARD_TABLE = "django_locks_atomic_guard"
LOST_SQLSTATE = "DLK01"
"""The SQLSTATE the guard's trigger raises when the lease is no longer the block's."""

_CHECK = "django_locks_atomic_check"

PG_ATOMIC_DDL = f"""
CREATE TABLE IF NOT EXISTS {GUARD_TABLE} (
    id bigserial PRIMARY KEY,
    lease_key varchar(500) NOT NULL,
    owner varchar(255) NOT NULL,
    fencing_token bigint NOT NULL,
    wait_ms integer NOT NULL
);
CREATE OR REPLACE FUNCTION {_CHECK}() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    -- Inside COMMIT: the only wait is for a renewal's or an acquire's row lock (one statement).
    PERFORM set_config('lock_timeout', NEW.wait_ms || 'ms', true);
    PERFORM 1 FROM {TABLE} AS lease
    WHERE lease.key = NEW.lease_key AND lease.owner = NEW.owner
        AND lease.fencing_token = NEW.fencing_token
        AND lease.released_at IS NULL AND lease.expires_at > clock_timestamp()
    FOR SHARE;
    IF NOT FOUND THEN
        RAISE EXCEPTION USING ERRCODE = '{LOST_SQLSTATE}',
            MESSAGE = format('django_locks: the lease on %L (fencing token %s) is no longer '
                'this block''s: its transaction is rolled back', NEW.lease_key,
                NEW.fencing_token);
    END IF;
    DELETE FROM {GUARD_TABLE} WHERE id = NEW.id;
    RETURN NULL;
END
$$;
DROP TRIGGER IF EXISTS {_CHECK} ON {GUARD_TABLE};
CREATE CONSTRAINT TRIGGER {_CHECK} AFTER INSERT ON {GUARD_TABLE}
    DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION {_CHECK}();
"""

PG_ATOMIC_DROP = f"""
DROP TABLE IF EXISTS {GUARD_TABLE};
DROP FUNCTION IF EXISTS {_CHECK}();
"""

# The block's first statement: the guard row and both timeouts (milliseconds, as text), and the
# isolation level the transaction runs at (only READ COMMITTED is accepted).
PG_ATOMIC_START = f"""
INSERT INTO {GUARD_TABLE} (lease_key, owner, fencing_token, wait_ms)
SELECT %s, %s, %s, %s FROM (
    SELECT set_config('statement_timeout', %s, true) AS statement_timeout,
        set_config('idle_in_transaction_session_timeout', %s, true) AS idle_timeout
) AS timeouts
RETURNING current_setting('transaction_isolation')
"""

# Just before COMMIT: a COMMIT cancelled midway (a synchronous replication wait) would leave it
# committed locally only.
PG_ATOMIC_END = "SELECT set_config('statement_timeout', '0', true)"

# Under a TestCase's wrapping transaction nothing commits: the check is a plain read.
PG_ATOMIC_LIVE = f"""
SELECT 1 FROM {TABLE} WHERE key = %s AND owner = %s AND fencing_token = %s
    AND released_at IS NULL AND expires_at > clock_timestamp()
"""

_SQLITE_LIVE = "released_at IS NULL AND julianday(expires_at) > julianday('now')"
_SQLITE_ASKED = "preempt_token IS NOT NULL AND preempt_token = fencing_token"

# Checks and extends in one statement, counted as a renewal sent before it once the COMMIT
# succeeded. A lease asked for by a replacing run is not extended (its renewals have stopped):
# the UPDATE moves nothing then, and SQLITE_ATOMIC_LIVE (a second statement, in that case only)
# tells it from a lease gone.
SQLITE_ATOMIC_CHECK = f"""
UPDATE {TABLE} SET expires_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now', %s),
    renewed_at = strftime('%%Y-%%m-%%d %%H:%%M:%%f', 'now')
WHERE key = %s AND owner = %s AND fencing_token = %s AND {_SQLITE_LIVE}
    AND NOT ({_SQLITE_ASKED})
"""

SQLITE_ATOMIC_LIVE = f"""
SELECT 1 FROM {TABLE} WHERE key = %s AND owner = %s AND fencing_token = %s AND {_SQLITE_LIVE}
"""
