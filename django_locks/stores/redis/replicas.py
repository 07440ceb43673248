"""``min_replicas``: what the Redis store says when fewer replicas confirmed a write than asked.

``WAIT`` counts the replicas that acknowledged every write of the connection so far; it is sent
in the same write as the acquire's or renewal's script (``Pool.confirmed``). It narrows what a
failover loses (a lease the promoted replica never received) and does not end it: Redis
replication stays asynchronous, and a replica that confirmed may not be the one promoted.
"""

from __future__ import annotations

from typing import Any

from django_locks.exceptions import StoreError
from django_locks.stores import runtime
from django_locks.stores.redis.scripts import Script, pack
from django_locks.stores.redis.wire import Calls

_FIX = (
    "See the master's replicas with redis-cli INFO replication: with fewer connected_slaves "
    "than 'min_replicas' (a master just promoted has none until a replica is attached to it), "
    "attach replicas or lower 'min_replicas'; with replicas lagging, raise the store's "
    "'replica_timeout'."
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


class Replicated(Calls):
    """The store's calls that ``min_replicas`` confirms (``RedisStore`` is one)."""

    _options: Any  # options.Options
    release: Any  # LockStore.release

    @property
    def min_replicas(self) -> int:
        return int(self._options.min_replicas)

    @property
    def replica_timeout_ms(self) -> int:
        return int(self._options.replica_timeout_ms)

    @property
    def sentinels(self) -> list[tuple[str, int]]:
        return list(self._options.sentinels)

    @property
    def service_name(self) -> str | None:
        return self._options.service_name  # type: ignore[no-any-return]

    def _replicated(
        self, name: bytes, command: bytes, deadline: float, script: Script
    ) -> tuple[Any, int | None]:
        """``command`` on the key's server and, with ``min_replicas`` (a lone master: refused
        with ``cluster``), ``WAIT`` pipelined after it: the reply and how many replicas
        confirmed it (``None`` without ``min_replicas``)."""
        if not self.min_replicas:
            return self._routed(name, command, self._left(deadline), script), None
        return self._pool(None).confirmed(command, self._wait_command(), deadline, script)

    def _wait_command(self) -> bytes:
        return pack("WAIT", self.min_replicas, self.replica_timeout_ms)

    def _require_replicas(
        self, key: str, owner: str, confirmed: int | None, deadline: float
    ) -> None:
        """A lease granted on the master but confirmed by fewer than ``min_replicas`` replicas
        is released at once (a failover could lose it) and the acquire is a ``StoreError``,
        never "not acquired" (another may not hold it)."""
        if confirmed is None or confirmed >= self.min_replicas:
            return
        try:
            self.release(key, owner, timeout=max(self._left(deadline), 0.5))
            ended = "released"
        except StoreError as exc:
            ended = f"its release failed too ({exc}), so it lapses at its ttl"
        raise StoreError(
            unconfirmed_grant(
                str(self), key, confirmed, self.min_replicas, self.replica_timeout_ms, ended
            )
        )

    def _renewals_confirmed(self, answer: Any, keys: int) -> None:
        """``WAIT``'s answer after a renewal or a batch (``None``: not asked): fewer replicas
        than ``min_replicas`` is a ``StoreError`` for the batch (each lease then counts as not
        renewed, and is tried again until its deadline)."""
        if answer is None:
            return
        if isinstance(answer, BaseException):
            raise runtime.translated(answer, str(self), timed_out=False) from answer
        if int(answer) < self.min_replicas:
            raise StoreError(
                unconfirmed_renewal(
                    str(self), int(answer), self.min_replicas, self.replica_timeout_ms, keys
                )
            )
