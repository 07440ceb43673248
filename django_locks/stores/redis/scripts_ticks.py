"""The Redis store's Lua script of tick records (what beat writes before it publishes a tick of an
``on_one_instance(catch_up=True)`` entry), and the calls reading and finding them."""

from __future__ import annotations

from django_locks.exceptions import StoreError
from django_locks.stores.base import PERMITS_OWNER, TickRecord
from django_locks.stores.redis.scripts import Names, _evalsha, _script, bulk, lease_pattern, pack

# A key's tick record is a string of its own next to its lease, under the same hash tag (one
# Cluster slot): <prefix>:{<digest>}:tick, "<tick_ms>:<token>", the token that of the lease that
# wrote it. Like the fencing counter it has no expiry, and no script of a lease names it: the
# lease's expiry, its release, an operator's release and the next holder's acquire all leave it,
# so the beat taking a key over reads what its predecessor recorded. clear() deletes it. 0.1.0's
# scripts and listing never see it (its SCAN pattern ends in ':lease').
assert PERMITS_OWNER == "permits"  # the owner the script below refuses

# Atomic: the owner's live plain lease found and the record written with its token in one step.
# KEYS[1]: the key's lease, KEYS[2]: its record. ARGV: owner, tick_ms (its digits), the key
# (checked against the lease's 'key': a digest collision is another key's lease). A key's own
# record under permits (owner 'permits', with 'permits') holds no lease of anyone's: refused; a
# permit's slot lives under another name (KEYS[1]:<n>, see scripts_permits.py), never KEYS[1].
# An expired lease no longer exists for Redis. Answers 1 when written, 0 (nothing written) else.
RECORD_TICK_SCRIPT = """
local lease = redis.call('HMGET', KEYS[1], 'owner', 'token', 'key', 'permits')
if lease[1] ~= ARGV[1] or lease[1] == 'permits' or lease[4] or not lease[2]
    or lease[3] ~= ARGV[3] then
  return 0
end
redis.call('SET', KEYS[2], ARGV[2] .. ':' .. lease[2])
return 1
"""

# Not idempotent for the wire's resend: a write the lease's expiry followed would answer 0 the
# second time, while its record stays written.
RECORD_TICK = _script(RECORD_TICK_SCRIPT)
_RECORD_TICK = _evalsha(RECORD_TICK, 2, 3)


def record_tick_call(names: Names, owner: str, tick_ms: int) -> bytes:
    """The record script's call on the key's lease and record (ARGV: owner, tick_ms, key)."""
    return b"".join(
        (
            _RECORD_TICK,
            bulk(names.lease),
            bulk(names.tick),
            bulk(owner.encode()),
            bulk(b"%d" % tick_ms),
            names.key,
        )
    )


def recorded_tick_call(names: Names) -> bytes:
    """One GET of the key's record."""
    return pack("GET", names.tick)


def tick_record(reply: bytes | None, name: bytes) -> TickRecord | None:
    """The record a GET of ``name`` answered, ``None`` when there is none."""
    if reply is None:
        return None
    tick, _, token = reply.partition(b":")
    try:
        return TickRecord(int(tick), int(token))
    except ValueError:
        raise StoreError(
            f"The tick record {name.decode(errors='replace')!r} holds {reply[:40]!r}, not "
            "'<tick_ms>:<token>': it was written by something else than django_locks."
        ) from None


def tick_pattern(prefix: str) -> str:
    """The SCAN pattern of every tick record under ``prefix`` (for clear())."""
    return lease_pattern(prefix)[: -len("lease")] + "tick"
