"""``InMemoryStore``: leases in this process's memory. Protects one process only."""

from __future__ import annotations

import dataclasses
import datetime
import threading
import time
from collections.abc import Sequence

from django_locks.clock import Clock
from django_locks.stores.base import LeaseInfo, LockStore, check_older_than, holder_name

# The longest expires_in a listing shows: a timedelta cannot hold more than 999,999,999 days, and a
# lease taken with a huge ttl_ms (by a caller of the store itself) must not crash leases().
_LONGEST = datetime.timedelta(days=999_999_998).total_seconds()


@dataclasses.dataclass
class _Lease:
    owner: str
    holder: str
    token: int
    acquired_at: datetime.datetime
    expires_at: float  # on the store's clock, in seconds (a release moves it to then)
    released: bool = False


class InMemoryStore(LockStore):
    """Leases in a dict guarded by a mutex; the store's clock is ``clock`` (default: the system's).

    Useful for tests and development. Refused at startup while ``DEBUG`` is False unless
    ``LOCKS["ALLOW_IN_MEMORY_STORAGE"]`` is set, since every process has its own.
    """

    takes_clock = True
    """Its leases run on its clock: ``LOCKS["CLOCK"]`` is passed as its ``clock`` option (a
    ``ManualClock`` moves them by moving, not by ``warp()``)."""

    def __init__(self, *, clock: Clock | None = None) -> None:
        if clock is not None and not isinstance(clock, Clock):
            raise TypeError(f"`clock` must be a django_locks Clock, got {clock!r}")
        self._clock = clock
        self._mutex = threading.Lock()
        self._released = threading.Condition(self._mutex)
        self._releases: dict[str, int] = {}  # per key: how many releases so far
        self._leases: dict[str, _Lease] = {}
        self._floor = 0  # the highest token of a pruned lease: new keys' tokens start above it

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
            token = (previous.token if previous is not None else self._floor) + 1
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
        lease.expires_at = min(lease.expires_at, self._now())  # when it ended, for prune()
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

    keeps_ended_leases = True  # a released or expired lease stays, as its key's token floor

    def leases(self, *, include_inactive: bool = False) -> list[LeaseInfo]:
        with self._mutex:
            now = self._now()
            listed = [self._info(key, lease, now) for key, lease in self._leases.items()]
        listed = [info for info in listed if include_inactive or info.state == "held"]
        listed.sort(key=lambda info: (info.state != "held", info.key))
        return listed

    def lease(self, key: str, *, include_inactive: bool = False) -> LeaseInfo | None:
        with self._mutex:
            lease = self._leases.get(key)
            info = None if lease is None else self._info(key, lease, self._now())
        return info if info is not None and (include_inactive or info.state == "held") else None

    def prune(self, older_than_ms: int, *, dry_run: bool = False) -> int:
        check_older_than(older_than_ms)
        with self._mutex:
            # A lease ended at its expires_at (a release moves it there): a live one's is ahead.
            before = self._now() - older_than_ms / 1000
            ended = [key for key, lease in self._leases.items() if lease.expires_at < before]
            if not dry_run:
                for key in ended:
                    # The floor first: the pruned key starts over above every token it had.
                    self._floor = max(self._floor, self._leases.pop(key).token)
            return len(ended)

    @staticmethod
    def _info(key: str, lease: _Lease, now: float) -> LeaseInfo:
        if lease.released:
            state, expires_in = "released", None
        else:
            state = "held" if lease.expires_at > now else "expired"
            expires_in = datetime.timedelta(seconds=min(lease.expires_at - now, _LONGEST))
        return LeaseInfo(
            key=key,
            state=state,  # type: ignore[arg-type]
            owner=lease.owner,
            holder=lease.holder,
            fencing_token=lease.token,
            acquired_at=lease.acquired_at,
            expires_in=expires_in,
        )
