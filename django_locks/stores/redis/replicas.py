"""``min_replicas``: what the Redis store says when fewer replicas confirmed a write than asked.

``WAIT`` counts the replicas that acknowledged every write of the connection so far; it is sent
in the same write as the acquire's or renewal's script (``Pool.confirmed``). It narrows what a
failover loses (a lease the promoted replica never received) and does not end it: Redis
replication stays asynchronous, and a replica that confirmed may not be the one promoted.
"""

from __future__ import annotations

_FIX = (
    "See the master's replicas with redis-cli INFO replication (connected_slaves, each lag), "
    "or raise the store's 'replica_timeout'."
)


def unconfirmed_grant(
    where: str, key: str, confirmed: int, wanted: int, ms: int, ended: str
) -> str:
    return (
        f"The lock {key!r} was granted on the master of {where}, confirmed by {confirmed} of "
        f"{wanted} replicas within {ms} ms; {ended}. {_FIX}"
    )


def unconfirmed_renewal(where: str, confirmed: int, wanted: int, ms: int, keys: int) -> str:
    what = "A renewal" if keys == 1 else f"A renewal of {keys} leases"
    return (
        f"{what} on the master of {where} was confirmed by {confirmed} of {wanted} replicas "
        f"within {ms} ms: not counted as renewed (the renewer tries again until the holder's "
        f"deadline). {_FIX}"
    )
