"""The Redis store's Lua scripts, its key names, and the calls of a lock, packed once per call."""

from __future__ import annotations

import functools
import hashlib
from typing import NamedTuple

from django_locks.holders import MAX_DETAIL, Holder

# Every script below is atomic because Redis runs a script to completion before it serves any
# other command: the ownership check and the write it guards are one step, never a read followed
# by a write from the client. Each script touches only KEYS that share one hash tag, hence one
# Cluster slot. Expiry is PEXPIRE in milliseconds on the server's clock.
#
# KEYS[1] is the lease, a hash {key, owner, holder, token, acquired_at} (0.1.0's layout), to which
# 0.2.0 adds {kind, detail, renewed_at} (see ACQUIRE_AS_SCRIPT) and {preempt} (a preempt request,
# scripts_preempt.py); KEYS[2] is the key's fencing counter, a string that never expires and only
# grows.
#
# The scripts of 0.1.0 (ACQUIRE, RENEW, RELEASE, FORCE_RELEASE, INSPECT) stay byte for byte, SHAs
# and all (tests/stores/test_redis.py pins them): during a rolling upgrade (SPEC section 9) a
# 0.1.0 process calls them on the same leases, and they ignore the fields they do not know.

# Atomic: the free-or-mine check, the token drawn and the lease written in one script.
# A free key gets token max(counter + 1, server TIME in microseconds): the counter keeps tokens
# growing when the clock does not, the TIME floor keeps them growing when the counter was lost
# (a crash before the last writes reached the disk, an eviction, a FLUSHALL). Lua numbers are
# doubles, exact up to 2^53 (TIME in microseconds gets there in the year 2255): a token beyond
# is refused, never rounded. string.format('%d') keeps all 16 digits where tostring would print
# 1.7e+15. The same owner gets its token back and its lease extended, so a retry after a
# timeout never strands the lease.
ACQUIRE_SCRIPT = """
local holder = redis.call('HGET', KEYS[1], 'owner')
if holder then
  if holder ~= ARGV[1] then
    return false
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return tonumber(redis.call('HGET', KEYS[1], 'token'))
end
local now = redis.call('TIME')
local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
local token = tonumber(redis.call('GET', KEYS[2]) or '0') + 1
if token < now_us then
  token = now_us
end
if token > 9007199254740991 then
  return redis.error_reply('django_locks: fencing token beyond 2^53 - 1, Lua numbers lose digits')
end
local token_s = string.format('%d', token)
redis.call('SET', KEYS[2], token_s)
redis.call('HSET', KEYS[1], 'key', ARGV[4], 'owner', ARGV[1], 'holder', ARGV[3],
  'token', token_s, 'acquired_at', string.format('%d', math.floor(now_us / 1000)))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return token
"""

# Atomic: ownership is checked and the expiry moved in one step; an expired lease no longer
# exists for Redis, so it is never revived.
RENEW_SCRIPT = """
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

# KEYS[3] is the key's wake-up list: one element wakes one waiter blocked in BLPOP (one is all
# a handover needs); it lapses after a second when nobody waits.
_WAKE_ONE = """
  redis.call('DEL', KEYS[3])
  redis.call('RPUSH', KEYS[3], '1')
  redis.call('PEXPIRE', KEYS[3], 1000)
"""
# Atomic: ownership is checked, the lease deleted and a waiter woken in one step; the counter
# (KEYS[2]) is untouched.
RELEASE_SCRIPT = f"""
if redis.call('HGET', KEYS[1], 'owner') == ARGV[1] then
  redis.call('DEL', KEYS[1])
{_WAKE_ONE}
  return 1
end
return 0
"""
# Atomic: an operator's release (or the testing reset), whoever holds it, waking a waiter the
# same way in the same step.
FORCE_RELEASE_SCRIPT = f"""
if redis.call('DEL', KEYS[1]) == 1 then
{_WAKE_ONE}
  return 1
end
return 0
"""

# Atomic: reads the lease and its remaining time in one step, so a listing never pairs one
# holder's fields with the next holder's expiry.
INSPECT_SCRIPT = """
local lease = redis.call('HMGET', KEYS[1], 'key', 'owner', 'holder', 'token', 'acquired_at')
if not lease[2] then
  return false
end
lease[6] = redis.call('PTTL', KEYS[1])
return lease
"""

# Atomic (testing aid, LockStore.warp): the lease's remaining time shortened by ARGV[1] ms in
# one step; a lease with no time left is deleted as its expiry would delete it (no wake-up,
# counter kept). A key's own record held by permits has its slots (KEYS[1]:<n>) shortened in
# the same step, so it never ends before its latest slot.
WARP_SCRIPT = """
local function warp(name)
  local left = redis.call('PTTL', name)
  if left < 0 then
    return 0
  end
  left = left - tonumber(ARGV[1])
  if left <= 0 then
    redis.call('DEL', name)
  else
    redis.call('PEXPIRE', name, left)
  end
  return 1
end
local lease = redis.call('HMGET', KEYS[1], 'owner', 'permits')
if lease[1] == 'permits' and lease[2] then
  for n = 1, tonumber(lease[2]) do
    warp(KEYS[1] .. ':' .. n)
  end
end
return warp(KEYS[1])
"""


# Version 3 (0.2.0): the holder's description and the last renewal, in the same scripts.

_NOW_MS = "tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)"

# The token a free key (or a free slot of a key taken with permits) gets, as ACQUIRE_SCRIPT draws
# it: max(counter + 1, server TIME in microseconds), refused beyond 2^53 - 1; leaves `now`,
# `now_us` and `token_s` (the token as a string of all its digits) set.
DRAW_TOKEN = """
local now = redis.call('TIME')
local now_us = tonumber(now[1]) * 1000000 + tonumber(now[2])
local token = tonumber(redis.call('GET', KEYS[2]) or '0') + 1
if token < now_us then
  token = now_us
end
if token > 9007199254740991 then
  return redis.error_reply('django_locks: fencing token beyond 2^53 - 1, Lua numbers lose digits')
end
local token_s = string.format('%d', token)
redis.call('SET', KEYS[2], token_s)
"""

# Atomic: ACQUIRE_SCRIPT, also writing what the holder says of itself ('holder' "host:pid", 'kind',
# 'detail'); when another owner holds the key, that holder's fields, its PTTL and the server's
# TIME in ms are returned instead of nil, in the same step (so expires_at is on the server's
# clock). Success still answers the integer token. ARGV: owner, ttl, key, holder, kind, detail.
# A key whose own record is held by permits (owner 'permits', see scripts_permits.py) answers
# {'permits', N} instead, nothing written: a plain lock never takes it. So does a key "k#2" that
# is a live slot of "k": KEYS[3], that slot's lease, is given on a lone server only (on Redis
# Cluster it lives in another hash slot, and the store looks it up in a call of its own).
ACQUIRE_AS_SCRIPT = f"""
if KEYS[3] then
  local slot = redis.call('HMGET', KEYS[3], 'key', 'permits')
  if slot[1] == ARGV[3] and slot[2] then
    return {{'permits', tonumber(slot[2])}}
  end
end
local owner = redis.call('HGET', KEYS[1], 'owner')
if owner then
  if owner == 'permits' then
    local permits = redis.call('HGET', KEYS[1], 'permits')
    if permits then
      return {{'permits', tonumber(permits)}}
    end
  end
  if owner ~= ARGV[1] then
    local lease = redis.call('HMGET', KEYS[1], 'holder', 'kind', 'detail', 'acquired_at')
    local now = redis.call('TIME')
    lease[5] = redis.call('PTTL', KEYS[1])
    lease[6] = {_NOW_MS}
    return lease
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  redis.call('HSET', KEYS[1], 'holder', ARGV[4], 'kind', ARGV[5], 'detail', ARGV[6])
  return tonumber(redis.call('HGET', KEYS[1], 'token'))
end
{DRAW_TOKEN}
redis.call('HSET', KEYS[1], 'key', ARGV[3], 'owner', ARGV[1], 'holder', ARGV[4],
  'kind', ARGV[5], 'detail', ARGV[6],
  'token', token_s, 'acquired_at', string.format('%d', math.floor(now_us / 1000)))
redis.call('PEXPIRE', KEYS[1], ARGV[2])
return token
"""

# Atomic: RENEW_SCRIPT, also recording the server's TIME in ms as 'renewed_at'. With ARGV[3]
# ('1'), KEYS[1] is one permit's slot and KEYS[2] its key's own record, whose expiry is moved to
# at least the slot's in the same step (one script renews plain locks and permits alike, so a
# renewal batch loads one script). A lease carrying a preempt request naming its own token
# ('preempt', see scripts_preempt.py) answers 2, neither extended nor recorded: checked in the
# same step as the owner, so no renewal after the request's write extends the lease.
RENEW_RECORDED_SCRIPT = f"""
local lease = redis.call('HMGET', KEYS[1], 'owner', 'token', 'preempt')
if lease[1] == ARGV[1] then
  if lease[3] and lease[3] == lease[2] then
    return 2
  end
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  local now = redis.call('TIME')
  redis.call('HSET', KEYS[1], 'renewed_at', string.format('%d', {_NOW_MS}))
  if ARGV[3] and redis.call('HGET', KEYS[2], 'owner') == 'permits'
      and redis.call('PTTL', KEYS[2]) < tonumber(ARGV[2]) then
    redis.call('PEXPIRE', KEYS[2], ARGV[2])
  end
  return 1
end
return 0
"""

# Atomic: INSPECT_SCRIPT with the fields of version 3 (false where a 0.1.0 process wrote the
# lease; 'permit' and 'permits' on a slot, 'permits' on a key's own record), its PTTL and the
# server's TIME in ms, read in one step.
DESCRIBE_SCRIPT = f"""
local lease = redis.call('HMGET', KEYS[1], 'key', 'owner', 'holder', 'token', 'acquired_at',
  'kind', 'detail', 'renewed_at', 'permit', 'permits')
if not lease[2] then
  return false
end
local now = redis.call('TIME')
lease[11] = redis.call('PTTL', KEYS[1])
lease[12] = {_NOW_MS}
return lease
"""


class Script(NamedTuple):
    body: str
    sha: bytes  # what EVALSHA names it by
    idempotent: bool
    """Run twice, it answers as run once: acquire and renew for the same owner (SPEC section
    4), the read-only inspect; the wire may send such a call again after a connection failed."""


def _script(body: str, *, idempotent: bool = False) -> Script:
    return Script(body, hashlib.sha1(body.encode()).hexdigest().encode(), idempotent)


ACQUIRE = _script(ACQUIRE_SCRIPT, idempotent=True)
RENEW = _script(RENEW_SCRIPT, idempotent=True)
RELEASE = _script(RELEASE_SCRIPT)
FORCE_RELEASE = _script(FORCE_RELEASE_SCRIPT)
INSPECT = _script(INSPECT_SCRIPT, idempotent=True)  # 0.1.0's listing: no caller here
WARP = _script(WARP_SCRIPT)
ACQUIRE_AS = _script(ACQUIRE_AS_SCRIPT, idempotent=True)
RENEW_RECORDED = _script(RENEW_RECORDED_SCRIPT, idempotent=True)
DESCRIBE = _script(DESCRIBE_SCRIPT, idempotent=True)


# RESP, as the server reads it (the commands only: replies are read by redis-py).


def bulk(arg: bytes) -> bytes:
    """``arg`` as a RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(arg), arg)


def pack(*command: bytes | str | int | float) -> bytes:
    """``command`` in RESP, as redis-py's ``pack_command`` makes it for the arguments this store
    sends (bytes, str, int, float), at a fraction of its cost."""
    out = [b"*%d\r\n" % len(command)]
    for arg in command:
        if isinstance(arg, str):
            arg = arg.encode()
        elif isinstance(arg, int):
            arg = b"%d" % arg
        elif isinstance(arg, float):
            arg = repr(arg).encode()
        out.append(bulk(arg))
    return b"".join(out)


def verb(command: bytes) -> str:
    """The command's name (``EVALSHA``), for error messages."""
    return command.split(b"\r\n", 3)[2].decode(errors="replace")


# Key names.


class Names(NamedTuple):
    lease: bytes
    fence: bytes
    released: bytes
    two_keys: bytes  # lease and fence in RESP: the KEYS of acquire and renew
    three_keys: bytes  # lease, fence and the wake-up list in RESP: the KEYS of release
    key: bytes  # the key itself in RESP
    tick: bytes  # the key's tick record (scripts_ticks.py)


@functools.lru_cache(maxsize=4096)
def names(prefix: str, key: str) -> Names:
    """The names of ``key``'s lease, fencing counter, wake-up list and tick record.

    The hash tag is a digest, so braces or any other character in a key cannot move the tag, and
    the four always share one Cluster slot. 128 bits: even a collision would only make two keys
    contend; the shared counter still only grows."""
    tag = hashlib.sha256(key.encode()).hexdigest()[:32]
    base = f"{prefix}:{{{tag}}}:".encode()
    lease, fence, released = base + b"lease", base + b"fence", base + b"released"
    two = bulk(lease) + bulk(fence)
    three = two + bulk(released)
    return Names(lease, fence, released, two, three, bulk(key.encode()), base + b"tick")


def siblings(lease: bytes) -> tuple[bytes, bytes]:
    """The fencing counter and wake-up list next to the lease named ``lease``."""
    base = lease[: -len(b"lease")]
    return base + b"fence", base + b"released"


def lease_pattern(prefix: str, *, slots: bool = False) -> str:
    """The SCAN pattern of every lease under ``prefix``; with ``slots``, also every permit's
    slot (``...:lease:<n>``, which 0.1.0's listing never matches)."""
    escaped = "".join("\\" + c if c in "*?[]\\" else c for c in prefix)
    return escaped + (":{*}:lease*" if slots else ":{*}:lease")


# The calls of a lock: the start of each EVALSHA packed once per process, the key's names once
# per key (names() is cached), so a call is a few bytes joined, never packed per argument.


def _evalsha(script: Script, keys: int, args: int) -> bytes:
    return b"*%d\r\n" % (3 + keys + args) + bulk(b"EVALSHA") + bulk(script.sha) + bulk(b"%d" % keys)


_ACQUIRE_AS = _evalsha(ACQUIRE_AS, 2, 6)
_ACQUIRE_AS_CHECKED = _evalsha(ACQUIRE_AS, 3, 6)
_RENEW = _evalsha(RENEW, 2, 2)
_RENEW_RECORDED = _evalsha(RENEW_RECORDED, 2, 2)
_RENEW_FOLLOWED = _evalsha(RENEW_RECORDED, 2, 3)
_FOLLOW = bulk(b"1")
_RELEASE = _evalsha(RELEASE, 3, 1)
EMPTY = bulk(b"")


@functools.lru_cache(maxsize=64)
def described(address: str, kind: str) -> bytes:
    # A lone surrogate must not fail an acquire: it is written as "?".
    return bulk(address.encode(errors="replace")) + bulk(kind.encode(errors="replace"))


def acquire_as_call(
    names: Names, owner: str, ttl_ms: int, holder: Holder, slot: bytes | None = None
) -> bytes:
    """The acquire-as script's call (ARGV: owner, ttl, key, holder's address, kind, detail);
    the address and kind packed once per process, the detail (a task id: new for each task)
    per call, cut at ``MAX_DETAIL`` as the database store's column is. ``slot``: the lease of
    the permit slot the key names (``"k#2"``), checked in the same script (a lone server only)."""
    detail = holder.detail
    return b"".join(
        (
            _ACQUIRE_AS if slot is None else _ACQUIRE_AS_CHECKED,
            names.two_keys if slot is None else names.two_keys + bulk(slot),
            bulk(owner.encode()),
            bulk(b"%d" % ttl_ms),
            names.key,
            described(holder.address, holder.kind),
            bulk(detail[:MAX_DETAIL].encode(errors="replace")) if detail else EMPTY,
        )
    )


def renew_call(names: Names, owner: str, ttl_ms: int) -> bytes:
    """The renew script's call, recording the renewal (ARGV: owner, ttl)."""
    return b"".join((_RENEW_RECORDED, names.two_keys, bulk(owner.encode()), bulk(b"%d" % ttl_ms)))


def renew_slot_call(slot: bytes, base: Names, owner: str, ttl_ms: int) -> bytes:
    """The renew script's call on one permit's ``slot`` lease, moving its key's own record
    (``base.lease``) along (ARGV: owner, ttl, '1')."""
    return b"".join(
        (
            _RENEW_FOLLOWED,
            bulk(slot),
            bulk(base.lease),
            bulk(owner.encode()),
            bulk(b"%d" % ttl_ms),
            _FOLLOW,
        )
    )


def leave_call(names: Names, owner: str, ttl_ms: int) -> bytes:
    """0.1.0's renew script's call (ARGV: owner, ttl): a lease left to lapse is moved to its
    end without counting as a renewal, as in the reference store."""
    return b"".join((_RENEW, names.two_keys, bulk(owner.encode()), bulk(b"%d" % ttl_ms)))


def release_call(names: Names, owner: str) -> bytes:
    """The release script's call (ARGV: owner)."""
    return _RELEASE + names.three_keys + bulk(owner.encode())


def describe_call(lease: bytes) -> bytes:
    return pack("EVALSHA", DESCRIBE.sha, 1, lease)


def warp_call(lease: bytes, delta_ms: int) -> bytes:
    return pack("EVALSHA", WARP.sha, 1, lease, int(delta_ms))


def script_load(script: Script) -> bytes:
    return pack("SCRIPT", "LOAD", script.body)
