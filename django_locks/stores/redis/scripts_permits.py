"""The Redis store's Lua scripts of permits (a key's slots), their key names and their calls."""

from __future__ import annotations

import re

from django_locks.holders import MAX_DETAIL, Holder
from django_locks.keys import MAX_PERMITS
from django_locks.stores.base import PERMITS_OWNER
from django_locks.stores.redis import scripts
from django_locks.stores.redis.scripts import (
    _NOW_MS,
    DRAW_TOKEN,
    EMPTY,
    Names,
    _evalsha,
    _script,
    bulk,
    described,
    pack,
)

# A key taken with permits=N keeps, under the key's own hash tag (one Cluster slot, as every
# script below touches):
#
# * its own record, the lease hash 0.1.0 reads (KEYS[1] of the plain scripts): owner 'permits',
#   'permits' N, 'token' the highest token drawn, 'holder' the address of its first slot's
#   holder, expiry the latest of its slots'. A 0.1.0 process reads it as another owner's live
#   lease, so its acquire of the key finds it held; this release's plain acquire raises
#   PermitsMismatchError on it (ACQUIRE_AS_SCRIPT);
# * one lease hash per live slot, named after the record with ':<n>' (0.1.0's SCAN pattern,
#   ending in ':lease', never matches it): the fields of a plain lease ('key' "<key>#<n>"),
#   'permit' n and 'permits' N, expiring on its own;
# * the key's one fencing counter (KEYS[2] of the plain scripts), which every slot's token is
#   drawn from, and its wake-up list, which every slot's release pushes to.
assert PERMITS_OWNER == "permits"  # the owner the scripts below write and compare

# Where a slot's expiry moved earlier or it ended: the record's expiry becomes the latest of the
# live slots' (KEYS[2] the record), the record deleted when none is live (the counter kept).
_FOLLOW_END = """
local record = redis.call('HMGET', KEYS[2], 'owner', 'permits')
if record[1] == 'permits' and record[2] then
  local latest = 0
  for n = 1, tonumber(record[2]) do
    local left = redis.call('PTTL', KEYS[2] .. ':' .. n)
    if left > latest then
      latest = left
    end
  end
  if latest > 0 then
    redis.call('PEXPIRE', KEYS[2], latest)
  else
    redis.call('DEL', KEYS[2])
  end
end
"""

# One waiter of the key woken (KEYS[3] its wake-up list), as RELEASE_SCRIPT wakes one.
_WAKE_ONE = """
redis.call('DEL', KEYS[3])
redis.call('RPUSH', KEYS[3], '1')
redis.call('PEXPIRE', KEYS[3], 1000)
"""

# Atomic: the permits check, the search for the owner's own slot or the lowest free one, the
# token drawn, and the slot and the record written, in one script: of any number of callers,
# never more than N slots are live. KEYS: the key's record, its counter (and, on a lone server,
# the lease of the slot the key itself names, as ACQUIRE_AS_SCRIPT's KEYS[3]). ARGV: owner,
# ttl, key, holder's address, kind, detail, permits. Answers {token, n} when taken (the
# owner's own live slot: extended, the same grant); {'permits', live} when the key's live
# leases use another permits value (a plain lease, or a slot: 1), nothing written; when every
# slot is live, the fields of the slot ending first as ACQUIRE_AS_SCRIPT answers a holder.
ACQUIRE_PERMIT_SCRIPT = f"""
if KEYS[3] and redis.call('HGET', KEYS[3], 'key') == ARGV[3] then
  return {{'permits', 1}}
end
local permits = tonumber(ARGV[7])
local ttl = tonumber(ARGV[2])
local record = redis.call('HMGET', KEYS[1], 'owner', 'permits')
if record[1] then
  local live = tonumber(record[2])
  if record[1] ~= 'permits' or not live then
    return {{'permits', 1}}
  end
  if live ~= permits then
    return {{'permits', live}}
  end
end
-- The record held for at least ttl, written anew when missing (its first slot, or deleted by
-- hand while slots were live: then it lasts as long as the latest of them).
local function hold(token_s, acquired_at, others)
  if record[1] then
    if token_s then
      redis.call('HSET', KEYS[1], 'token', token_s)
    end
    if redis.call('PTTL', KEYS[1]) < ttl then
      redis.call('PEXPIRE', KEYS[1], ttl)
    end
    return
  end
  redis.call('HSET', KEYS[1], 'key', ARGV[3], 'owner', 'permits', 'holder', ARGV[4],
    'token', redis.call('GET', KEYS[2]) or token_s, 'acquired_at', acquired_at,
    'permits', ARGV[7])
  local latest = ttl
  for n = 1, others and permits or 0 do
    local left = redis.call('PTTL', KEYS[1] .. ':' .. n)
    if left > latest then
      latest = left
    end
  end
  redis.call('PEXPIRE', KEYS[1], latest)
end
local free, others = false, false
for n = 1, permits do
  local slot = KEYS[1] .. ':' .. n
  local owner = redis.call('HGET', slot, 'owner')
  if not owner then
    free = free or n
  elseif owner == ARGV[1] then
    redis.call('PEXPIRE', slot, ttl)
    hold(false, redis.call('HGET', slot, 'acquired_at'), true)
    return {{tonumber(redis.call('HGET', slot, 'token')), n}}
  else
    others = true
  end
end
if not free then
  local first, left = 1, redis.call('PTTL', KEYS[1] .. ':1')
  for n = 2, permits do
    local t = redis.call('PTTL', KEYS[1] .. ':' .. n)
    if t < left then
      first, left = n, t
    end
  end
  local lease = redis.call('HMGET', KEYS[1] .. ':' .. first, 'holder', 'kind', 'detail',
    'acquired_at')
  local now = redis.call('TIME')
  lease[5] = left
  lease[6] = {_NOW_MS}
  return lease
end
{DRAW_TOKEN}
local acquired_at = string.format('%d', math.floor(now_us / 1000))
local slot = KEYS[1] .. ':' .. free
redis.call('HSET', slot, 'key', ARGV[3] .. '#' .. free, 'owner', ARGV[1], 'holder', ARGV[4],
  'kind', ARGV[5], 'detail', ARGV[6], 'token', token_s, 'acquired_at', acquired_at,
  'permit', free, 'permits', ARGV[7])
redis.call('PEXPIRE', slot, ttl)
hold(token_s, acquired_at, others)
return {{token, free}}
"""

# Atomic: ownership of the slot (KEYS[1]) checked and its expiry moved, without recording a
# renewal (RENEW_SCRIPT's leave), and its key's record (KEYS[2]) moved to match: at least the
# slot's new expiry, or the latest of the live slots' when this one's moved earlier.
# ARGV: owner, ttl.
LEAVE_PERMIT_SCRIPT = f"""
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[1], ARGV[2])
{_FOLLOW_END}
return 1
"""

# Atomic: ownership of the slot (KEYS[1]) checked, the slot deleted, its key's record (KEYS[2])
# moved to its other live slots' latest expiry (deleted when none is left) and a waiter of the
# key woken (KEYS[3]) in one step; the counter is untouched. ARGV: owner.
RELEASE_PERMIT_SCRIPT = f"""
if redis.call('HGET', KEYS[1], 'owner') ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
{_FOLLOW_END}
{_WAKE_ONE}
return 1
"""

# Atomic: an operator's release of one slot, whoever holds it (its 'key' checked against ARGV[1]:
# a digest collision is another key's), as RELEASE_PERMIT_SCRIPT frees it.
FORCE_RELEASE_SLOT_SCRIPT = f"""
if redis.call('HGET', KEYS[1], 'key') ~= ARGV[1] then
  return 0
end
redis.call('DEL', KEYS[1])
{_FOLLOW_END}
{_WAKE_ONE}
return 1
"""

# Atomic: an operator's release of a key (or the testing reset), whoever holds it: a plain
# lease deleted as FORCE_RELEASE_SCRIPT does, or a record held by permits deleted with every
# slot, waking a waiter in the same step. KEYS: the lease, its counter (untouched), its wake-up
# list (FORCE_RELEASE_SCRIPT's).
FORCE_END_SCRIPT = f"""
local lease = redis.call('HMGET', KEYS[1], 'owner', 'permits')
if not lease[1] then
  return 0
end
if lease[1] == 'permits' and lease[2] then
  for n = 1, tonumber(lease[2]) do
    redis.call('DEL', KEYS[1] .. ':' .. n)
  end
end
redis.call('DEL', KEYS[1])
{_WAKE_ONE}
return 1
"""

ACQUIRE_PERMIT = _script(ACQUIRE_PERMIT_SCRIPT, idempotent=True)
LEAVE_PERMIT = _script(LEAVE_PERMIT_SCRIPT, idempotent=True)
RELEASE_PERMIT = _script(RELEASE_PERMIT_SCRIPT)
FORCE_RELEASE_SLOT = _script(FORCE_RELEASE_SLOT_SCRIPT)
FORCE_END = _script(FORCE_END_SCRIPT)

_SLOT_KEY = re.compile(r"(.+)#([1-9][0-9]{0,3})", re.DOTALL)


def slot_of(key: str) -> tuple[str, int] | None:
    """``(base, permit)`` when ``key`` has the shape of a slot's key (``"k#2"``, the permit 1 to
    ``MAX_PERMITS`` written as the service writes it), else ``None``. Only the slot's lease says
    whether it is one: ``"invoice#12"`` is a plain key unless ``invoice`` has a live slot 12."""
    found = _SLOT_KEY.fullmatch(key)
    if found is None or int(found[2]) > MAX_PERMITS:
        return None
    return found[1], int(found[2])


def slot_names(prefix: str, base: str, permit: int) -> tuple[bytes, Names]:
    """The name of the lease of ``base``'s slot ``permit``, and ``base``'s names."""
    names = scripts.names(prefix, base)
    return names.lease + b":%d" % permit, names


def shaped_slot(prefix: str, key: str) -> tuple[bytes, Names] | None:
    """:func:`slot_names` of the slot ``key`` names, when it has the shape of a slot's key."""
    shaped = slot_of(key)
    return None if shaped is None else slot_names(prefix, *shaped)


_ACQUIRE_PERMIT = _evalsha(ACQUIRE_PERMIT, 2, 7)
_ACQUIRE_PERMIT_CHECKED = _evalsha(ACQUIRE_PERMIT, 3, 7)
_RELEASE_PERMIT = _evalsha(RELEASE_PERMIT, 3, 1)


def acquire_permit_call(
    names: Names,
    owner: str,
    ttl_ms: int,
    permits: int,
    holder: Holder,
    slot: bytes | None = None,
) -> bytes:
    """The acquire-permit script's call (ARGV: owner, ttl, key, holder's address, kind,
    detail, permits), packed as acquire-as's is. ``slot``: the lease of the slot the key names
    (``"k#2"``), checked in the same script (a lone server only)."""
    detail = holder.detail
    return b"".join(
        (
            _ACQUIRE_PERMIT if slot is None else _ACQUIRE_PERMIT_CHECKED,
            names.two_keys if slot is None else names.two_keys + bulk(slot),
            bulk(owner.encode()),
            bulk(b"%d" % ttl_ms),
            names.key,
            described(holder.address, holder.kind),
            bulk(detail[:MAX_DETAIL].encode(errors="replace")) if detail else EMPTY,
            bulk(b"%d" % permits),
        )
    )


def leave_permit_call(slot: bytes, base: Names, owner: str, ttl_ms: int) -> bytes:
    return pack("EVALSHA", LEAVE_PERMIT.sha, 2, slot, base.lease, owner, ttl_ms)


def release_permit_call(slot: bytes, base: Names, owner: str) -> bytes:
    return b"".join(
        (_RELEASE_PERMIT, bulk(slot), bulk(base.lease), bulk(base.released), bulk(owner.encode()))
    )


def force_release_slot_call(slot: bytes, base: Names, key: str) -> bytes:
    return pack("EVALSHA", FORCE_RELEASE_SLOT.sha, 3, slot, base.lease, base.released, key)


def force_end_call(lease: bytes, fence: bytes, released: bytes) -> bytes:
    return pack("EVALSHA", FORCE_END.sha, 3, lease, fence, released)
