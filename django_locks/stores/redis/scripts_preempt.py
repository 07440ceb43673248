"""The Redis store's Lua script of preempt requests (what ``on_conflict="replace"`` writes)."""

from __future__ import annotations

from django_locks.stores.base import PERMITS_OWNER
from django_locks.stores.redis.scripts import Names, _evalsha, _script, bulk

# A preempt request is one field of the lease it asks, 'preempt': the token of that lease (the
# digits of its 'token' field). Being a field of the lease's hash, it expires and is deleted with
# the lease (release, expiry, an operator's release), never outlives it, and needs no key of its
# own: a new lease of the key is a new hash, without it; the same owner's idempotent acquire keeps
# the hash, and the request with it. RENEW_RECORDED_SCRIPT answers it. 0.1.0's scripts read only
# the fields they know, so they ignore it: a 0.1.0 process's renewals are never preempted.
assert PERMITS_OWNER == "permits"  # the owner the script below compares

# Atomic: the live lease found, the request written on it and its token returned in one step,
# so the request names the lease it was written on, never one that ended meanwhile. KEYS[1]: the
# key's lease (its record under permits, whose slots are KEYS[1]:<n>, on the same hash tag).
# ARGV[1]: the key, checked against the lease's 'key' (a digest collision is another key's). On
# a key held by permits the request goes on the live slot with the lowest token (the oldest
# holder). Answers the token asked, or nil (nothing written) when no live lease holds the key.
PREEMPT_SCRIPT = """
local lease = redis.call('HMGET', KEYS[1], 'owner', 'token', 'key', 'permits')
if not lease[1] or lease[3] ~= ARGV[1] then
  return false
end
local asked, token_s = KEYS[1], lease[2]
if lease[1] == 'permits' and lease[4] then
  asked, token_s = false, false
  local lowest = 0
  for n = 1, tonumber(lease[4]) do
    local slot = KEYS[1] .. ':' .. n
    local held = redis.call('HMGET', slot, 'owner', 'token')
    if held[1] and held[2] and (not asked or tonumber(held[2]) < lowest) then
      asked, token_s, lowest = slot, held[2], tonumber(held[2])
    end
  end
  if not asked then
    return false
  end
end
if not token_s then
  return false
end
redis.call('HSET', asked, 'preempt', token_s)
return tonumber(token_s)
"""

PREEMPT = _script(PREEMPT_SCRIPT, idempotent=True)
_PREEMPT = _evalsha(PREEMPT, 1, 1)


def preempt_call(names: Names) -> bytes:
    """The preempt script's call on the key's lease (ARGV: the key)."""
    return b"".join((_PREEMPT, bulk(names.lease), names.key))
