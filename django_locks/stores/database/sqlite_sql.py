"""The database store's SQLite SQL: every statement ``sqlite.py`` runs, built once at import."""

from __future__ import annotations

from django_locks.stores.base import PERMITS_OWNER
from django_locks.stores.database.operations import SEQUENCE, TABLE

# Every write runs inside BEGIN IMMEDIATE (the database's write lock, taken up front so that
# concurrent writers wait for it instead of failing to upgrade a read lock), which makes the few
# statements below one atomic step. Times are Django's text format, from SQLite's 'now' (the
# machine's clock: one machine only), compared through julianday(). The token floor is the
# one-row table holding the highest token ever handed out, so a pruned row's key never goes back.
_NOW = "strftime('%Y-%m-%d %H:%M:%f', 'now')"
_EXPIRY = "strftime('%Y-%m-%d %H:%M:%f', 'now', ?)"
_LIVE = "released_at IS NULL AND julianday(expires_at) > julianday('now')"
_NEXT = f"(SELECT value + 1 FROM {SEQUENCE} WHERE id = 1)"
# An UPDATE's SET reads the row as it was: both token columns get the same value, and the
# CASEs still see the previous owner.
_SAME = f"owner = excluded.owner AND {_LIVE}"
_TOKEN = (
    f"CASE WHEN {_SAME} THEN fencing_token ELSE max(fencing_token + 1, excluded.fencing_token) END"
)
_PERMITS = f"'{PERMITS_OWNER}'"
# Besides the lease, the holder's kind and detail and which lease they describe (the new token:
# see models.Lease), the last renewal and any end record cleared, and a preempt request kept
# only by the same owner's live lease (a new lease's token makes it stale anyway); a row a key
# taken with permits left (its own, or a slot's) becomes a plain lease's. Never over a live one
# of those, even the owner's own: sqlite.py reads the refusal and raises the permits mismatch.
SQLITE_ACQUIRE_AS = f"""
INSERT INTO {TABLE} (key, owner, holder, fencing_token, acquired_at, expires_at, released_at,
    holder_kind, holder_detail, described_token, renewed_at, end_reason, ended_by)
VALUES (?, ?, ?, {_NEXT}, {_NOW}, {_EXPIRY}, NULL, ?, ?, {_NEXT}, NULL, NULL, NULL)
ON CONFLICT (key) DO UPDATE SET
    fencing_token = {_TOKEN},
    described_token = {_TOKEN},
    acquired_at = CASE WHEN {_SAME} THEN acquired_at ELSE excluded.acquired_at END,
    renewed_at = CASE WHEN {_SAME} THEN renewed_at END,
    owner = excluded.owner,
    holder = excluded.holder,
    holder_kind = excluded.holder_kind,
    holder_detail = excluded.holder_detail,
    expires_at = excluded.expires_at,
    released_at = NULL,
    end_reason = NULL,
    ended_by = NULL,
    permits = NULL,
    base_key = NULL,
    preempt_token = CASE WHEN {_SAME} THEN preempt_token END
WHERE (owner = excluded.owner AND permits IS NULL AND base_key IS NULL) OR NOT ({_LIVE})
"""
SQLITE_TOKEN = f"SELECT fencing_token FROM {TABLE} WHERE key = ?"
_DESCRIBED = "described_token = fencing_token"
# The holder that refused an acquire, read in the acquire's own transaction (then whether it is
# a key taken with permits: its own row, or a slot's).
_HOLDER = f"""holder, CASE WHEN {_DESCRIBED} THEN holder_kind END,
    CASE WHEN {_DESCRIBED} THEN holder_detail END, acquired_at, expires_at"""
SQLITE_HOLDER = f"SELECT {_HOLDER}, owner, permits, base_key FROM {TABLE} WHERE key = ?"
SQLITE_RAISE_FLOOR = f"UPDATE {SEQUENCE} SET value = max(value, ?) WHERE id = 1"
# A renewal moves a lease not asked to give its key up (a preempt request naming its token);
# when it moves none, SQLITE_PREEMPTED, in the same transaction, says whether the owner's live
# lease is there, asked (the renewal's answer: preempted, not extended).
_ASKED = "preempt_token IS NOT NULL AND preempt_token = fencing_token"
SQLITE_RENEW = f"""
UPDATE {TABLE} SET expires_at = {_EXPIRY}, renewed_at = {_NOW}, end_reason = NULL
WHERE key = ? AND owner = ? AND {_LIVE} AND NOT ({_ASKED})
"""
SQLITE_PREEMPTED = f"SELECT 1 FROM {TABLE} WHERE key = ? AND owner = ? AND {_LIVE} AND {_ASKED}"
SQLITE_LEAVE = f"""
UPDATE {TABLE} SET expires_at = {_EXPIRY}, end_reason = ? WHERE key = ? AND owner = ? AND {_LIVE}
"""

# Tick records (migration 0007): the owner of the key's live plain lease (never a permit's slot,
# nor a key's own record) records a tick with its token, judged as SQLITE_RENEW judges; no other
# statement writes the two columns (the upserts name theirs), so the record outlives the lease.
SQLITE_RECORD_TICK = f"""
UPDATE {TABLE} SET tick_ms = ?, tick_token = fencing_token
WHERE key = ? AND owner = ? AND owner <> {_PERMITS} AND base_key IS NULL AND {_LIVE}
"""
SQLITE_RECORDED_TICK = f"""
SELECT tick_ms, tick_token FROM {TABLE}
WHERE key = ? AND tick_ms IS NOT NULL AND tick_token IS NOT NULL
"""
SQLITE_CLEAR_TICKS = f"""
UPDATE {TABLE} SET tick_ms = NULL, tick_token = NULL
WHERE tick_ms IS NOT NULL OR tick_token IS NOT NULL"""


# A lease ends recording how and by whom; one a 0.1.0 process took (other token) is described
# from here on as what is known of it: no kind, detail or renewal, this end.
def _end(how: str, by: str) -> str:
    return f"""
UPDATE {TABLE} SET released_at = {_NOW},
    expires_at = CASE WHEN julianday(expires_at) > julianday('now') THEN {_NOW}
        ELSE expires_at END,
    end_reason = {how}, ended_by = {by},
    holder_kind = CASE WHEN {_DESCRIBED} THEN holder_kind END,
    holder_detail = CASE WHEN {_DESCRIBED} THEN holder_detail END,
    renewed_at = CASE WHEN {_DESCRIBED} THEN renewed_at END,
    described_token = fencing_token
WHERE {_LIVE}"""


SQLITE_END = _end("?", "NULL") + " AND key = ? AND owner = ?"
SQLITE_FORCE_END = _end("'force released'", "?") + " AND key = ?"
SQLITE_CLEAR = _end("'force released'", "'locks.clear()'")
SQLITE_WARP = f"""
UPDATE {TABLE} SET expires_at = strftime('%Y-%m-%d %H:%M:%f', expires_at, ?) WHERE {_LIVE}"""
SQLITE_LEASES = f"""
SELECT key, owner, holder, fencing_token, acquired_at,
    CASE WHEN released_at IS NOT NULL THEN 'released'
         WHEN julianday(expires_at) > julianday('now') THEN 'held' ELSE 'expired' END,
    CAST(round((julianday(expires_at) - julianday('now')) * 86400000) AS integer),
    expires_at, coalesce({_DESCRIBED}, 0), holder_kind, holder_detail, renewed_at, end_reason,
    ended_by, CASE WHEN base_key IS NOT NULL THEN CAST(substr(key, length(base_key) + 2) AS integer)
    END, CASE WHEN base_key IS NOT NULL OR owner = {_PERMITS} THEN permits END
FROM {TABLE}
"""
SQLITE_LEASES_HELD = SQLITE_LEASES + f" WHERE {_LIVE}"
SQLITE_LEASE = SQLITE_LEASES + " WHERE key = ?"
SQLITE_LEASE_HELD = SQLITE_LEASE + f" AND {_LIVE}"
# Pruning: the counter already holds the highest token ever handed out (every acquire raises
# it); raising it again costs nothing and keeps the rule local. The transaction's first write
# takes the database's write lock, which keeps the store's writers out until the rows are gone.
_STALE = "julianday(expires_at) < julianday('now', ?)"
SQLITE_PRUNE_FLOOR = f"""
UPDATE {SEQUENCE} SET value = max(value, coalesce(
    (SELECT max(fencing_token) FROM {TABLE} WHERE {_STALE}), 0)) WHERE id = 1
"""
SQLITE_PRUNE_DELETE = f"DELETE FROM {TABLE} WHERE {_STALE}"
SQLITE_PRUNE_COUNT = f"SELECT count(*) FROM {TABLE} WHERE {_STALE}"
# One key prefix's rows alone (LOCKS["KEY_PREFIX"], of Locks.prune()): its length, then itself.
# Compared exactly (SQLite's LIKE ignores case); the floor above is raised as for every prune.
_PREFIXED = "substr(key, 1, ?) = ?"
SQLITE_PRUNE_DELETE_PREFIXED = f"{SQLITE_PRUNE_DELETE} AND {_PREFIXED}"
SQLITE_PRUNE_COUNT_PREFIXED = f"{SQLITE_PRUNE_COUNT} AND {_PREFIXED}"
SQLITE_TABLES = "SELECT name FROM sqlite_master WHERE type = 'table' AND name IN (?, ?, ?)"
SQLITE_COLUMNS = "SELECT name FROM pragma_table_info(?)"


def offset(ms: int) -> str:
    """``ms`` milliseconds from now, as SQLite's date functions take it."""
    return f"+{ms / 1000:.3f} seconds"


def numbered(args: tuple[object, ...]) -> dict[str, object]:
    """``args`` for a statement with numbered parameters (``?1``, ``?2``): Python's sqlite3
    binds those by name (``"1"``), and a sequence for them is deprecated since Python 3.12."""
    return {str(number): value for number, value in enumerate(args, 1)}


# Permits (SPEC section 4): a key's slots are the rows `<key>#<n>` whose base_key is the key, all
# between `<key>#` and `<key>$` in the primary key's order (binary: '$' follows '#'), so each
# look-up of a key's slots is one range of the index. The key's own row (owner "permits" while
# any slot is live) is the token floor of its slots and records the highest token drawn. All in
# one BEGIN IMMEDIATE transaction, which sqlite.py runs as a few statements and decides between
# them: what it read stays as read until it commits.
_IN_RANGE = "key >= ?1 AND key < ?2"
SQLITE_PERMIT_BASE = f"SELECT owner, permits, base_key, {_LIVE} FROM {TABLE} WHERE key = ?"
# The live rows among the key's slot keys, the one ending first first.
SQLITE_PERMIT_SLOTS = f"""
SELECT key, owner, base_key, fencing_token, {_HOLDER} FROM {TABLE}
WHERE {_IN_RANGE} AND {_LIVE} ORDER BY julianday(expires_at)"""
# The owner's own live slot, again: extended, its holder's description refreshed.
SQLITE_PERMIT_EXTEND = f"""
UPDATE {TABLE} SET expires_at = strftime('%Y-%m-%d %H:%M:%f', 'now', ?1), holder = ?2,
    holder_kind = ?3, holder_detail = ?4, end_reason = NULL
WHERE key = ?5 AND owner = ?6"""
# A free slot (no row, or one no live lease holds) taken: its token above the counter's and the
# key's own row's, and its own row's.
_SLOT_TOKEN = (
    f"max((SELECT value FROM {SEQUENCE} WHERE id = 1), "
    f"coalesce((SELECT b.fencing_token FROM {TABLE} AS b WHERE b.key = ?8), 0)) + 1"
)
_COLUMNS = """key, owner, holder, fencing_token, acquired_at, expires_at, released_at,
    holder_kind, holder_detail, described_token, renewed_at, end_reason, ended_by, permits,
    base_key"""
SQLITE_PERMIT_TAKE = f"""
INSERT INTO {TABLE} ({_COLUMNS})
VALUES (?1, ?2, ?3, {_SLOT_TOKEN}, {_NOW}, strftime('%Y-%m-%d %H:%M:%f', 'now', ?4), NULL, ?5, ?6,
    {_SLOT_TOKEN}, NULL, NULL, NULL, ?7, ?8)
ON CONFLICT (key) DO UPDATE SET
    fencing_token = max(fencing_token + 1, excluded.fencing_token),
    described_token = max(fencing_token + 1, excluded.fencing_token),
    owner = excluded.owner, holder = excluded.holder, acquired_at = excluded.acquired_at,
    expires_at = excluded.expires_at, released_at = NULL, holder_kind = excluded.holder_kind,
    holder_detail = excluded.holder_detail, renewed_at = NULL, end_reason = NULL,
    ended_by = NULL, permits = excluded.permits, base_key = excluded.base_key,
    preempt_token = NULL"""
# The key's own row, held by "permits" until the latest of its slots' expiries (at least the new
# slot's), recording the slot's token (the highest drawn) and the permits value; its holder is
# the process that took its first live slot.
SQLITE_PERMIT_RECORD = f"""
INSERT INTO {TABLE} ({_COLUMNS})
VALUES (?1, {_PERMITS}, ?5, ?2, {_NOW}, (SELECT s.expires_at FROM {TABLE} AS s
    WHERE s.key = ?3), NULL, NULL, NULL, ?2, NULL, NULL, NULL, ?4, NULL)
ON CONFLICT (key) DO UPDATE SET
    acquired_at = CASE WHEN {_LIVE} THEN acquired_at ELSE excluded.acquired_at END,
    renewed_at = CASE WHEN {_LIVE} THEN renewed_at END,
    expires_at = CASE WHEN {_LIVE} AND julianday(expires_at) >= julianday(excluded.expires_at)
        THEN expires_at ELSE excluded.expires_at END,
    fencing_token = excluded.fencing_token, described_token = excluded.fencing_token,
    holder = CASE WHEN {_LIVE} THEN holder ELSE excluded.holder END,
    owner = excluded.owner, released_at = NULL, holder_kind = NULL,
    holder_detail = NULL, end_reason = NULL, ended_by = NULL, permits = excluded.permits,
    base_key = NULL"""
# The latest expiry of the key's (?3) live slots; NULL when none is live.
_LATEST = f"""(SELECT expires_at FROM {TABLE} WHERE {_IN_RANGE} AND base_key = ?3 AND {_LIVE}
    ORDER BY julianday(expires_at) DESC LIMIT 1)"""
# After a slot (?4) moved (renewed, left, acquired again): the key's own row lasts as long as its
# latest live slot, looked for among them all only when this one moved earlier than the row.
_MOVED = f"(SELECT s.expires_at FROM {TABLE} AS s WHERE s.key = ?4)"
SQLITE_PERMIT_FOLLOW = f"""
UPDATE {TABLE} SET expires_at = CASE WHEN julianday({_MOVED}) >= julianday(expires_at)
    THEN {_MOVED} ELSE COALESCE({_LATEST}, {_MOVED}) END
WHERE key = ?3 AND owner = {_PERMITS} AND {_LIVE}"""
# (COALESCE: a slot moved to a 1 ms ttl may have expired by this statement's 'now', leaving no
# live slot: the key's own row then ends with it.)
# After a slot ended, or a batch renewed slots: the key's own row until the latest of its live
# slots', or (none left: no row updated) ended as the last slot was.
SQLITE_PERMIT_LATEST = f"""
UPDATE {TABLE} SET expires_at = {_LATEST}
WHERE key = ?3 AND owner = {_PERMITS} AND {_LIVE} AND {_LATEST} IS NOT NULL"""
SQLITE_PERMIT_FREE = _end("?2", "?3") + f" AND key = ?1 AND owner = {_PERMITS}"
# force_end() of the key itself: every live slot too.
SQLITE_PERMIT_FORCE_SLOTS = _end("'force released'", "?3") + f" AND {_IN_RANGE} AND base_key = ?4"
# Preempt requests: the request names the token of the key's live lease or, for a key held by
# permits, of its live slot with the lowest token (the oldest holder), found as one range of the
# primary key; sqlite.py reads the key's own row first (SQLITE_PERMIT_BASE), in the transaction.
SQLITE_OLDEST_SLOT = f"""
SELECT key FROM {TABLE} WHERE {_IN_RANGE} AND base_key = ?3 AND {_LIVE}
ORDER BY fencing_token LIMIT 1"""
SQLITE_PREEMPT = f"UPDATE {TABLE} SET preempt_token = fencing_token WHERE key = ?"
