"""The database store's PostgreSQL SQL for permits: migration 0005's functions and their calls.

A key taken with permits has one row per slot ``<key>#<n>`` (recording ``base_key`` and
``permits``) besides its own row, the base (recording ``permits``; while any slot is live, held
by the owner ``permits`` until the latest slot's expiry, and the token floor of every slot: it
records the highest token drawn). Every function touching a base and its slots locks the BASE
row first, then slots; a batch locks its bases in key order first. So two callers of one key
queue on its base row and never deadlock, whatever the number of slots. A prune's table lock
lets row locks through but not writes: it skips the rows others have locked (an acquire's base
may have ended long ago); the other functions lock only live rows, which no prune deletes.

Functions with new names (SPEC section 9): 0002's and 0003's stay, unchanged, for the processes
of previous releases, which find a key held by permits simply held (owner ``permits``).
"""

from __future__ import annotations

from django_locks.stores.base import PERMITS_OWNER
from django_locks.stores.database.operations import SEQUENCE, TABLE
from django_locks.stores.database.postgresql_sql import (
    _DESCRIBED,
    _LIVE,
    _SAME,
    CHANNEL,
    _end,
    _expiry,
    _utc,
)

_OWNER = f"'{PERMITS_OWNER}'"


def _slots(base: str, permits: str) -> str:
    """The slot keys of ``base`` (an array), looked up through the primary key: no index on
    ``base_key`` (every write would update it). Kept in a variable: ``key = ANY(v_slots)``
    is planned once for every permits value (see _GENERIC)."""
    return f"ARRAY(SELECT {base} || '#' || n FROM generate_series(1, {permits}) AS n)"


# The functions on the path of a permit's acquire and release run their statements on generic
# plans, made once per session: left to choose, PostgreSQL planned the slots' statements anew
# on every call (generate_series(1, $n) is estimated at 1,000 rows in a generic plan, so the
# plan made for the call's own values looked cheaper), which cost a call 3 times what its
# statements did. Their generic plans read the slots through the primary key
# (key = ANY($slots), estimated at a few rows), also on a large table. A function's own setting,
# restored when it returns: no session state.
_GENERIC = "SET plan_cache_mode = force_generic_plan"


# A plain acquire, as 0003's django_locks_acquire_as, that also refuses a live slot's key (its
# row names its base) and a key held by permits, answering then with the permits value in use.
# A plain lease taken on an ended slot's row, or on a free base, no longer records either. Same
# statement otherwise: the plain path costs what it did.
def _acquire_plain(name: str, request: str = "") -> str:
    """The plain acquire function ``name``; ``request``: what its upsert's SET also writes."""
    return f"""
CREATE OR REPLACE FUNCTION {name}(p_key text, p_owner text, p_holder text,
    p_kind text, p_detail text, p_ttl_ms bigint, OUT taken bigint, OUT held_by text,
    OUT held_kind text, OUT held_detail text, OUT held_since timestamp,
    OUT held_until timestamp, OUT live_permits integer) LANGUAGE plpgsql AS $body$
BEGIN
    INSERT INTO {TABLE} AS lease
        (key, owner, holder, fencing_token, acquired_at, expires_at, released_at, holder_kind,
        holder_detail, described_token, renewed_at, end_reason, ended_by)
    SELECT p_key, p_owner, p_holder, drawn.token, clock_timestamp(), {_expiry("p_ttl_ms")},
        NULL, p_kind, p_detail, drawn.token, NULL, NULL, NULL
    FROM (SELECT nextval('{SEQUENCE}') AS token) AS drawn
    ON CONFLICT (key) DO UPDATE SET
        (fencing_token, described_token) = (SELECT chosen.token, chosen.token FROM (SELECT
            CASE WHEN {_SAME} THEN lease.fencing_token
            ELSE greatest(nextval('{SEQUENCE}'), lease.fencing_token + 1) END AS token)
            AS chosen),
        acquired_at = CASE WHEN {_SAME} THEN lease.acquired_at ELSE clock_timestamp() END,
        renewed_at = CASE WHEN {_SAME} THEN lease.renewed_at END,
        owner = excluded.owner,
        holder = excluded.holder,
        holder_kind = excluded.holder_kind,
        holder_detail = excluded.holder_detail,
        expires_at = {_expiry("p_ttl_ms")},
        released_at = NULL,
        end_reason = NULL,
        ended_by = NULL,
        permits = NULL,
        base_key = NULL{request}
    WHERE NOT ({_LIVE}) OR (lease.owner = excluded.owner AND lease.base_key IS NULL)
    RETURNING lease.fencing_token INTO taken;
    IF taken IS NULL THEN
        SELECT lease.holder, CASE WHEN {_DESCRIBED} THEN lease.holder_kind END,
            CASE WHEN {_DESCRIBED} THEN lease.holder_detail END, {_utc("lease.acquired_at")},
            {_utc("lease.expires_at")},
            CASE WHEN (lease.base_key IS NOT NULL OR lease.owner = {_OWNER}) AND {_LIVE}
                THEN coalesce(lease.permits, 1) END
        INTO held_by, held_kind, held_detail, held_since, held_until, live_permits
        FROM {TABLE} AS lease WHERE lease.key = p_key;
    END IF;
END
$body$;
"""


_ACQUIRE_PLAIN = _acquire_plain("django_locks_acquire_plain")

# One of p_permits slots. Answers the token and permit taken (the caller's own live slot: the
# same, extended), else the holder of the slot ending first (all live), else live_permits (the
# key's live leases use another permits value; nothing written). The slot's token is drawn under
# the base's lock and floored by the base's (the highest drawn) and the slot row's own; the slot
# and its base are written by one statement.
_BASE = (
    "lease.owner, lease.permits, lease.base_key, lease.fencing_token, lease.expires_at, "
    "lease.released_at"
)


def _acquire_permit(name: str, request: str = "") -> str:
    """The permit's acquire function ``name``; ``request``: what a new slot's upsert also
    writes."""
    return f"""
CREATE OR REPLACE FUNCTION {name}(p_key text, p_owner text,
    p_holder text, p_kind text, p_detail text, p_ttl_ms bigint, p_permits integer,
    OUT taken bigint, OUT permit integer, OUT live_permits integer, OUT held_by text,
    OUT held_kind text, OUT held_detail text, OUT held_since timestamp,
    OUT held_until timestamp) LANGUAGE plpgsql {_GENERIC} AS $body$
DECLARE
    v_base record;
    v_live boolean;
    v_slots text[];
    v_expiry timestamptz;
    v_scan boolean;
    v_mine integer;
    v_mine_token bigint;
    v_taken integer[];
    v_drawn bigint;
BEGIN
    SELECT {_BASE} INTO v_base FROM {TABLE} AS lease WHERE lease.key = p_key
    FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        -- A new key: its base row made free (or another caller's, made first), then locked.
        INSERT INTO {TABLE} AS lease (key, owner, holder, fencing_token, acquired_at,
            expires_at, released_at)
        VALUES (p_key, {_OWNER}, p_holder, 0, clock_timestamp(), clock_timestamp(),
            clock_timestamp())
        ON CONFLICT (key) DO NOTHING;
        SELECT {_BASE} INTO v_base FROM {TABLE} AS lease WHERE lease.key = p_key
        FOR NO KEY UPDATE;
    END IF;
    -- Judged now, once the lock is ours.
    v_live := v_base.released_at IS NULL AND v_base.expires_at > clock_timestamp();
    IF v_live AND (v_base.base_key IS NOT NULL OR v_base.owner <> {_OWNER}) THEN
        -- A plain lease, or a live slot (p_key is a slot's key): one lease.
        live_permits := 1;
        RETURN;
    END IF;
    IF v_live AND v_base.permits IS DISTINCT FROM p_permits THEN
        live_permits := v_base.permits;
        RETURN;
    END IF;
    v_expiry := {_expiry("p_ttl_ms")};
    -- While the base is free no slot is live: slot 1, unread. Else (or should slot 1 turn out
    -- taken, by a previous release's plain acquire of its key) the live slots are read: the
    -- caller's own, the lowest free (1..k live, k+1 not), the one ending first.
    v_scan := v_live;
    permit := 1;
    LOOP
        IF v_scan THEN
            v_slots := {_slots("p_key", "p_permits")};
            SELECT min(live.n) FILTER (WHERE live.mine),
                min(live.token) FILTER (WHERE live.mine), array_agg(live.n ORDER BY live.n)
            INTO v_mine, v_mine_token, v_taken
            FROM (SELECT substr(lease.key, length(p_key) + 2)::integer AS n,
                lease.owner = p_owner AS mine, lease.fencing_token AS token
                FROM {TABLE} AS lease WHERE lease.key = ANY(v_slots) AND {_LIVE}) AS live;
            IF v_mine IS NOT NULL THEN
                UPDATE {TABLE} AS lease SET expires_at = v_expiry, holder = p_holder,
                    holder_kind = p_kind, holder_detail = p_detail, end_reason = NULL
                WHERE lease.key = p_key || '#' || v_mine;
                UPDATE {TABLE} AS lease SET expires_at = greatest(lease.expires_at, v_expiry)
                WHERE lease.key = p_key;
                taken := v_mine_token;
                permit := v_mine;
                RETURN;
            END IF;
            -- The lowest free: the live ones in order are 1, 2, .. up to the first gap.
            WHILE v_taken[permit] = permit LOOP
                permit := permit + 1;
            END LOOP;
            IF permit > p_permits THEN
                permit := NULL;
                SELECT lease.holder, CASE WHEN {_DESCRIBED} THEN lease.holder_kind END,
                    CASE WHEN {_DESCRIBED} THEN lease.holder_detail END,
                    {_utc("lease.acquired_at")}, {_utc("lease.expires_at")}
                INTO held_by, held_kind, held_detail, held_since, held_until
                FROM {TABLE} AS lease WHERE lease.key = ANY(v_slots) AND {_LIVE}
                ORDER BY lease.expires_at, lease.key LIMIT 1;
                RETURN;
            END IF;
        END IF;
        v_drawn := nextval('{SEQUENCE}');
        WITH slot AS (
            INSERT INTO {TABLE} AS lease
                (key, owner, holder, fencing_token, acquired_at, expires_at, released_at,
                holder_kind, holder_detail, described_token, renewed_at, end_reason, ended_by,
                permits, base_key)
            VALUES (p_key || '#' || permit, p_owner, p_holder,
                greatest(v_drawn, v_base.fencing_token + 1), clock_timestamp(), v_expiry, NULL,
                p_kind, p_detail, greatest(v_drawn, v_base.fencing_token + 1), NULL, NULL,
                NULL, p_permits, p_key)
            ON CONFLICT (key) DO UPDATE SET
                (fencing_token, described_token) = (
                    greatest(v_drawn, v_base.fencing_token + 1, lease.fencing_token + 1),
                    greatest(v_drawn, v_base.fencing_token + 1, lease.fencing_token + 1)),
                acquired_at = clock_timestamp(),
                owner = excluded.owner,
                holder = excluded.holder,
                holder_kind = excluded.holder_kind,
                holder_detail = excluded.holder_detail,
                expires_at = excluded.expires_at,
                released_at = NULL,
                renewed_at = NULL,
                end_reason = NULL,
                ended_by = NULL,
                permits = excluded.permits,
                base_key = excluded.base_key{request}
            WHERE NOT ({_LIVE})
            RETURNING lease.fencing_token
        )
        UPDATE {TABLE} AS lease SET owner = {_OWNER}, permits = p_permits, base_key = NULL,
            fencing_token = slot.fencing_token, described_token = slot.fencing_token,
            holder = p_holder, holder_kind = p_kind, holder_detail = p_detail,
            released_at = NULL, end_reason = NULL, ended_by = NULL,
            expires_at = CASE WHEN v_live THEN greatest(lease.expires_at, v_expiry)
                ELSE v_expiry END,
            acquired_at = CASE WHEN v_live THEN lease.acquired_at ELSE clock_timestamp() END,
            renewed_at = CASE WHEN v_live THEN lease.renewed_at END
        FROM slot WHERE lease.key = p_key
        RETURNING slot.fencing_token INTO taken;
        EXIT WHEN taken IS NOT NULL OR v_scan;
        v_scan := true;
    END LOOP;
    IF taken IS NULL THEN
        permit := NULL;  -- not reached: the scan under the base's lock saw the slot free
    END IF;
END
$body$;
"""


_ACQUIRE_PERMIT = _acquire_permit("django_locks_acquire_permit")

# Renewals (and leaves: p_how set) of many leases, some of them slots (p_bases: a slot's base,
# NULL for a plain lease): the bases first, in key order, then every lease as PG_RENEW_MANY
# renews it, and each base moved to at least its latest renewed slot's expiry.
_RENEW_SLOTS = f"""
CREATE OR REPLACE FUNCTION django_locks_renew_slots(p_keys text[], p_owners text[],
    p_ttls bigint[], p_bases text[], p_how text)
    RETURNS TABLE (renewed_key text, renewed_owner text) LANGUAGE plpgsql AS $body$
BEGIN
    PERFORM 1 FROM {TABLE} AS lease WHERE lease.key = ANY(p_bases) AND {_LIVE}
        ORDER BY lease.key FOR NO KEY UPDATE;
    RETURN QUERY WITH renewed AS (
        UPDATE {TABLE} AS lease
        SET expires_at = clock_timestamp() + batch.ttl * interval '1 millisecond',
            renewed_at = CASE WHEN p_how IS NULL THEN clock_timestamp()
                ELSE lease.renewed_at END,
            end_reason = p_how
        FROM unnest(p_keys, p_owners, p_ttls, p_bases) AS batch (key, owner, ttl, base)
        WHERE lease.key = batch.key AND lease.owner = batch.owner AND {_LIVE}
        RETURNING lease.key, lease.owner, batch.base, lease.expires_at
    ), moved AS (
        UPDATE {TABLE} AS lease
        SET expires_at = greatest(lease.expires_at, latest.expires_at),
            renewed_at = CASE WHEN p_how IS NULL THEN clock_timestamp()
                ELSE lease.renewed_at END
        FROM (SELECT renewed.base, max(renewed.expires_at) AS expires_at FROM renewed
            WHERE renewed.base IS NOT NULL GROUP BY renewed.base) AS latest
        WHERE lease.key = latest.base AND lease.owner = {_OWNER} AND {_LIVE}
    )
    SELECT renewed.key::text, renewed.owner::text FROM renewed;
END
$body$;
"""

# A slot's end (p_owner NULL: whoever holds it, an operator's): the base locked first, then in
# one statement the slot freed and the base's expiry set to the latest of its other live
# slots' (freed with the same reason when none is), and the notice sent for the BASE key, which
# waiters wait on. A holder's own release commits as 0003's django_locks_end does; an
# operator's waits for the disk.
_SLOT_END = (
    f"{_end('p_how', 'p_by')} AND lease.key = p_key AND (p_owner IS NULL OR lease.owner = p_owner)"
)
_END_SLOT = f"""
CREATE OR REPLACE FUNCTION django_locks_end_slot(p_base text, p_key text, p_owner text,
    p_how text, p_by text) RETURNS boolean LANGUAGE plpgsql {_GENERIC} AS $body$
DECLARE
    v_permits integer;
    v_slots text[];
    v_freed boolean;
BEGIN
    SELECT CASE WHEN lease.owner = {_OWNER} THEN lease.permits END INTO v_permits
    FROM {TABLE} AS lease WHERE lease.key = p_base AND {_LIVE} FOR NO KEY UPDATE;
    IF v_permits IS NULL THEN
        {_SLOT_END};  -- no live record of the key's permits: the slot alone
        v_freed := FOUND;
    ELSE
        v_slots := {_slots("p_base", "v_permits")};
        -- One snapshot: the other slots are read as they were, the freed one left out. The
        -- base is written only when its expiry changes (the freed slot was the latest).
        WITH freed AS ({_SLOT_END} RETURNING lease.key), other AS (
            SELECT max(lease.expires_at) AS latest FROM {TABLE} AS lease
            WHERE lease.key = ANY(v_slots) AND lease.key <> p_key AND {_LIVE}
        ), moved AS (
            UPDATE {TABLE} AS lease
            SET expires_at = coalesce(other.latest, least(lease.expires_at, clock_timestamp())),
                released_at = CASE WHEN other.latest IS NULL THEN clock_timestamp() END,
                end_reason = CASE WHEN other.latest IS NULL THEN p_how
                    ELSE lease.end_reason END,
                ended_by = CASE WHEN other.latest IS NULL THEN p_by ELSE lease.ended_by END
            FROM other WHERE lease.key = p_base AND EXISTS (SELECT FROM freed)
                AND other.latest IS DISTINCT FROM lease.expires_at
        )
        SELECT count(*) > 0 INTO v_freed FROM freed;
    END IF;
    IF NOT v_freed THEN
        RETURN false;
    END IF;
    PERFORM pg_notify('{CHANNEL}', p_base);
    IF p_owner IS NOT NULL THEN
        -- This transaction only: a release need not wait for the disk (see postgresql.py).
        PERFORM set_config('synchronous_commit', 'off', true);
    END IF;
    RETURN true;
END
$body$;
"""

# An operator's release of any key, answering how many leases it freed: a slot's key as its
# end above; a key held by permits with every live slot; a plain lease alone. A slot's row names
# its base for good, so it is read unlocked to know which row to lock first.
_FORCE_END = f"""
CREATE OR REPLACE FUNCTION django_locks_force_end(p_key text, p_by text) RETURNS integer
LANGUAGE plpgsql AS $body$
DECLARE
    v_base text;
    v_owner text;
    v_permits integer;
    v_slots integer := 0;
BEGIN
    SELECT lease.base_key INTO v_base FROM {TABLE} AS lease WHERE lease.key = p_key;
    IF v_base IS NOT NULL THEN
        RETURN django_locks_end_slot(v_base, p_key, NULL, 'force released', p_by)::integer;
    END IF;
    SELECT lease.owner, lease.permits INTO v_owner, v_permits
    FROM {TABLE} AS lease WHERE lease.key = p_key AND {_LIVE} FOR NO KEY UPDATE;
    IF NOT FOUND THEN
        RETURN 0;
    END IF;
    {_end("'force released'", "p_by")} AND lease.key = p_key;
    IF v_owner = {_OWNER} AND v_permits IS NOT NULL THEN
        {_end("'force released'", "p_by")} AND lease.key = ANY({_slots("p_key", "v_permits")});
        GET DIAGNOSTICS v_slots = ROW_COUNT;
    END IF;
    PERFORM pg_notify('{CHANNEL}', p_key);
    RETURN 1 + v_slots;
END
$body$;
"""

PG_FUNCTIONS_V5 = _ACQUIRE_PLAIN + _ACQUIRE_PERMIT + _RENEW_SLOTS + _END_SLOT + _FORCE_END
"""Migration 0005's functions (``CREATE OR REPLACE``)."""
PG_DROP_FUNCTIONS_V5 = """
DROP FUNCTION IF EXISTS django_locks_force_end(text, text);
DROP FUNCTION IF EXISTS django_locks_end_slot(text, text, text, text, text);
DROP FUNCTION IF EXISTS django_locks_renew_slots(text[], text[], bigint[], text[], text);
DROP FUNCTION IF EXISTS django_locks_acquire_permit(text, text, text, text, text, bigint,
    integer);
DROP FUNCTION IF EXISTS django_locks_acquire_plain(text, text, text, text, text, bigint);
"""

# The calls. Numbers are cast (see PG_ACQUIRE_AS_CALL): an int out of range is an error of its
# own, never a call of a function the database lacks.
PG_ACQUIRE_PLAIN_CALL = "SELECT * FROM django_locks_acquire_plain(%s, %s, %s, %s, %s, %s::bigint)"
PG_ACQUIRE_PERMIT_CALL = (
    "SELECT * FROM django_locks_acquire_permit(%s, %s, %s, %s, %s, %s::bigint, %s::integer)"
)
PG_RENEW_SLOTS_CALL = (
    "SELECT * FROM django_locks_renew_slots(%s::text[], %s::text[], %s::bigint[], %s::text[], "
    "%s::text)"
)
PG_END_SLOT_CALL = "SELECT django_locks_end_slot(%s, %s, %s, %s, NULL)"
PG_FORCE_END_CALL = "SELECT django_locks_force_end(%s, %s)"
