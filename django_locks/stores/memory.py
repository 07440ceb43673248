"""``InMemoryStore``: leases in this process's memory. Protects one process only."""

from __future__ import annotations

import dataclasses
import datetime
import threading
import time
from collections.abc import Sequence

from django_locks.clock import Clock
from django_locks.stores.base import LeaseInfo, LockStore, holder_name

# The longest expires_in a listing shows: a timedelta cannot hold more than 999,999,999 days, and a
# lease taken with a huge ttl_ms (by a caller of the store itself) must not crash leases().
_LONGEST = datetime.timedelta(days=999_999_998).total_seconds()


@dataclasses.dataclass
class _Lease:
    owner: str
    holder: str
    token: int
    acquired_at: datetime.datetime
    expires_at: float  # on the store's clock, in seconds
    released: bool = False


class InMemoryStore(LockStore):
    """Leases in a dict guarded by a mutex; the store's clock is ``clock`` (default: the system's).

    Useful for tests and development. Refused at startup while ``DEBUG`` is False unless
    ``LOCKS["ALLOW_IN_MEMORY_STORAGE"]`` is set, since every process has its own.
    """

    def __init__(self, *, clock: Clock | None = None) -> None:
        if clock is not None and not isinstance(clock, Clock):
            raise TypeError(f"`clock` must be a django_locks Clock, got {clock!r}")
        self._clock = clock
        self._mutex = threading.Lock()
        self._released = threading.Condition(self._mutex)
        self._releases: dict[str, int] = {}  # per key: how many releases so far
        self._leases: dict[str, _Lease] = {}

    def _now(self) -> float:
        return self._clock.monotonic() if self._clock is not None else time.monotonic()

    def _live(self, key: str, now: float) -> _Lease | None:
        lease = self._leases.get(key)
        if lease is None or lease.released or lease.expires_at <= now:
            return None
        return lease

    def acquire(
        self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None
    ) -> int | None:
        with self._mutex:
            now = self._now()
            lease = self._live(key, now)
            if lease is not None:
                if lease.owner != owner:
                    return None
                lease.expires_at = now + ttl_ms / 1000
                return lease.token
            previous = self._leases.get(key)
            token = previous.token + 1 if previous is not None else 1
            self._leases[key] = _Lease(
                owner=owner,
                holder=holder_name(),
                token=token,
                acquired_at=datetime.datetime.now(datetime.UTC),
                expires_at=now + ttl_ms / 1000,
            )
            return token

    def renew(self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None) -> bool:
        with self._mutex:
            now = self._now()
            lease = self._live(key, now)
            if lease is None or lease.owner != owner:
                return False
            lease.expires_at = now + ttl_ms / 1000
            return True

    def renew_many(
        self, leases: Sequence[tuple[str, str, int]], *, timeout: float | None = None
    ) -> list[bool]:
        return [self.renew(key, owner, ttl_ms) for key, owner, ttl_ms in leases]

    def release(self, key: str, owner: str, *, timeout: float | None = None) -> bool:
        with self._mutex:
            lease = self._live(key, self._now())
            if lease is None or lease.owner != owner:
                return False
            self._mark_released(key, lease)
            return True

    def _mark_released(self, key: str, lease: _Lease) -> None:
        lease.released = True
        self._releases[key] = self._releases.get(key, 0) + 1
        self._released.notify_all()

    def wait_for_release(self, key: str, timeout: float) -> bool:
        with self._mutex:
            seen = self._releases.get(key, 0)
            return self._released.wait_for(
                lambda: self._releases.get(key, 0) != seen, timeout=max(timeout, 0)
            )

    def force_release(self, key: str) -> bool:
        with self._mutex:
            lease = self._live(key, self._now())
            if lease is None:
                return False
            self._mark_released(key, lease)
            return True

    def warp(self, delta_ms: int) -> None:
        with self._mutex:
            now = self._now()
            for key in list(self._leases):
                if self._live(key, now) is not None:
                    self._leases[key].expires_at -= delta_ms / 1000

    def clear(self) -> None:
        with self._mutex:
            for key, lease in self._leases.items():
                if not lease.released:
                    self._mark_released(key, lease)

    def leases(self, *, include_inactive: bool = False) -> list[LeaseInfo]:
        with self._mutex:
            now = self._now()
            listed = []
            for key, lease in self._leases.items():
                if lease.released:
                    state, expires_in = "released", None
                else:
                    state = "held" if lease.expires_at > now else "expired"
                    expires_in = datetime.timedelta(seconds=min(lease.expires_at - now, _LONGEST))
                if state != "held" and not include_inactive:
                    continue
                listed.append(
                    LeaseInfo(
                        key=key,
                        state=state,  # type: ignore[arg-type]
                        owner=lease.owner,
                        holder=lease.holder,
                        fencing_token=lease.token,
                        acquired_at=lease.acquired_at,
                        expires_in=expires_in,
                    )
                )
        listed.sort(key=lambda info: (info.state != "held", info.key))
        return listed
