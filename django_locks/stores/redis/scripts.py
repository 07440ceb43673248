"""The Redis store's Lua scripts, its key names, and the calls of a lock, packed once per call."""

from __future__ import annotations

import functools
import hashlib
from typing import NamedTuple

# Every script below is atomic because Redis runs a script to completion before it serves any
# other command: the ownership check and the write it guards are one step, never a read followed
# by a write from the client. Each script touches only KEYS that share one hash tag, hence one
# Cluster slot. Expiry is PEXPIRE in milliseconds on the server's clock.
#
# KEYS[1] is the lease, a hash {key, owner, holder, token, acquired_at}; KEYS[2] is the key's
# fencing counter, a string that never expires and only grows.

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
# counter kept).
WARP_SCRIPT = """
local left = redis.call('PTTL', KEYS[1])
if left < 0 then
  return 0
end
left = left - tonumber(ARGV[1])
if left <= 0 then
  redis.call('DEL', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], left)
end
return 1
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
INSPECT = _script(INSPECT_SCRIPT, idempotent=True)
WARP = _script(WARP_SCRIPT)


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


@functools.lru_cache(maxsize=4096)
def names(prefix: str, key: str) -> Names:
    """The names of ``key``'s lease, fencing counter and wake-up list.

    The hash tag is a digest, so braces or any other character in a key cannot move the tag, and
    the three always share one Cluster slot. 128 bits: even a collision would only make two keys
    contend; the shared counter still only grows."""
    tag = hashlib.sha256(key.encode()).hexdigest()[:32]
    base = f"{prefix}:{{{tag}}}:".encode()
    lease, fence, released = base + b"lease", base + b"fence", base + b"released"
    two = bulk(lease) + bulk(fence)
    return Names(lease, fence, released, two, two + bulk(released), bulk(key.encode()))


def siblings(lease: bytes) -> tuple[bytes, bytes]:
    """The fencing counter and wake-up list next to the lease named ``lease``."""
    base = lease[: -len(b"lease")]
    return base + b"fence", base + b"released"


def lease_pattern(prefix: str) -> str:
    """The SCAN pattern of every lease under ``prefix``."""
    return "".join("\\" + c if c in "*?[]\\" else c for c in prefix) + ":{*}:lease"


# The calls of a lock: the start of each EVALSHA packed once per process, the key's names once
# per key (names() is cached), so a call is a few bytes joined, never packed per argument.


def _evalsha(script: Script, keys: int, args: int) -> bytes:
    return b"*%d\r\n" % (3 + keys + args) + bulk(b"EVALSHA") + bulk(script.sha) + bulk(b"%d" % keys)


_ACQUIRE = _evalsha(ACQUIRE, 2, 4)
_RENEW = _evalsha(RENEW, 2, 2)
_RELEASE = _evalsha(RELEASE, 3, 1)


@functools.lru_cache(maxsize=16)
def _bulk_text(text: str) -> bytes:
    return bulk(text.encode())


def acquire_call(names: Names, owner: str, ttl_ms: int, holder: str) -> bytes:
    """The acquire script's call (ARGV: owner, ttl, holder, key)."""
    return (
        b"".join(
            (
                _ACQUIRE,
                names.two_keys,
                bulk(owner.encode()),
                bulk(b"%d" % ttl_ms),
                _bulk_text(holder),
            )
        )
        + names.key
    )


def renew_call(names: Names, owner: str, ttl_ms: int) -> bytes:
    """The renew script's call (ARGV: owner, ttl)."""
    return b"".join((_RENEW, names.two_keys, bulk(owner.encode()), bulk(b"%d" % ttl_ms)))


def release_call(names: Names, owner: str) -> bytes:
    """The release script's call (ARGV: owner)."""
    return _RELEASE + names.three_keys + bulk(owner.encode())


def inspect_call(lease: bytes) -> bytes:
    return pack("EVALSHA", INSPECT.sha, 1, lease)


def force_release_call(lease: bytes) -> bytes:
    return pack("EVALSHA", FORCE_RELEASE.sha, 3, lease, *siblings(lease))


def warp_call(lease: bytes, delta_ms: int) -> bytes:
    return pack("EVALSHA", WARP.sha, 1, lease, int(delta_ms))


def script_load(script: Script) -> bytes:
    return pack("SCRIPT", "LOAD", script.body)
