"""``EtcdStore``: leases in etcd, on its v3 KV API (transactions and revisions) through etcd3gw."""

from __future__ import annotations

import time
import weakref
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

from django_locks.durations import Duration, timeout_seconds
from django_locks.exceptions import PermitsMismatchError, StoreError
from django_locks.holders import Holder
from django_locks.stores import runtime
from django_locks.stores.base import (
    PERMITS_OWNER,
    LeaseInfo,
    LeaveReason,
    LockStore,
    ReleaseReason,
    Renewed,
    Slot,
    check_older_than,
    holder_name,
)
from django_locks.stores.etcd import checks, records
from django_locks.stores.etcd import wire as ops
from django_locks.stores.etcd.calls import Process
from django_locks.stores.etcd.listing import Listing
from django_locks.stores.etcd.permits import Permits
from django_locks.stores.etcd.records import Layout, Record
from django_locks.stores.etcd.renewals import names_token
from django_locks.stores.etcd.security import Security, security_problem
from django_locks.stores.etcd.ticks import Ticks
from django_locks.stores.etcd.wire import LeaseNotFound


class EtcdStore(Permits, Ticks, Listing, LockStore):
    """Leases in etcd: each lock a key whose ``create_revision`` is its fencing token, on an
    etcd lease this process keeps alive for every lock of the same ttl.

    Options (``LOCKS["OPTIONS"]``): ``endpoints`` (a list of ``http://host:port`` or
    ``https://...`` URLs of the cluster's members), ``prefix`` (keys live under
    ``<prefix>/``), ``timeout`` (a duration: the default bound of a call); TLS: ``ca_cert``
    (the CA bundle that signed the members' certificates), ``cert`` and ``key`` (a client
    certificate and its key); auth: ``user`` and ``password``. Built without I/O;
    connects on first use; safe from any thread and across ``fork()``.

    Permits (``permits.py``) keep each slot on a key of its own, ``<key>#<n>``, and the key's
    own record on the etcd lease of one of its live slots; tick records (``ticks.py``) live on
    no lease.
    """

    describes_holders = True
    supports_preempt = True

    def __init__(
        self,
        *,
        endpoints: Sequence[str] = ("http://127.0.0.1:2379",),
        prefix: str = "django_locks",
        timeout: Duration = 5,
        ca_cert: str | None = None,
        cert: str | None = None,
        key: str | None = None,
        user: str | None = None,
        password: str | None = None,
    ) -> None:
        if isinstance(endpoints, str):
            endpoints = [endpoints]
        problem = checks.endpoints_problem(endpoints)  # E301's rule: a list, not a dict or set
        if problem:
            raise ValueError(f"EtcdStore: {problem}")
        self.endpoints = [_endpoint(url) for url in endpoints]
        if not isinstance(prefix, str) or not prefix or "\x00" in prefix:
            raise ValueError(f"`prefix` of EtcdStore must be a non-empty str, got {prefix!r}")
        self.prefix = prefix
        self.timeout = timeout_seconds(timeout, name="timeout")
        self.layout = Layout(prefix)
        problem = security_problem(ca_cert, cert, key, user, password)
        if problem:
            raise ValueError(f"EtcdStore: {problem}")
        security = Security(ca_cert, cert, key, user, password)
        endpoints_, what, layout = self.endpoints, str(self), self.layout
        self._process = runtime.ProcessLocal(lambda: Process(endpoints_, what, layout, security))
        # A store dropped without close() ends its watch thread too (nothing above holds self).
        weakref.finalize(self, _stop_watch, self._process)

    def __repr__(self) -> str:
        return f"<EtcdStore endpoints={self._urls()!r} prefix={self.prefix!r}>"

    def __str__(self) -> str:
        return f"etcd {', '.join(url.split('://', 1)[1] for url in self._urls())}"

    def _urls(self) -> list[str]:
        return [f"{protocol}://{host}:{port}" for protocol, host, port in self.endpoints]

    def effective_ttl_ms(self, ttl_ms: int) -> int:
        """``ttl_ms`` rounded up to whole seconds and to the cluster's minimum lease TTL (learnt
        from this process's first lease grant): how long a lease really lives on etcd."""
        return self._process.get().leases.effective_ms(ttl_ms)

    # The contract.

    def acquire(
        self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None
    ) -> int | None:
        taken = self.acquire_as(key, owner, ttl_ms, Holder.parse(holder_name()), timeout=timeout)
        return taken if type(taken) is int else None

    def acquire_as(
        self, key: str, owner: str, ttl_ms: int, holder: Holder, *, timeout: float | None = None
    ) -> int | Holder | None:
        """One Txn: created on the shared lease (its token the new ``create_revision``), or,
        nested, re-put by the same owner (the same token), or the holder read; when taken, the
        shared lease is then kept alive unless this process did so within a renewal period
        before the call began (``_outlives``: one round trip more, else the key's lag)."""
        since = time.monotonic()
        deadline = self._deadline(timeout)
        names = self.layout.names(key)
        for _ in range(2):
            granted = self._shared(ttl_ms, deadline)
            value = records.value(owner, holder, self.effective_ttl_ms(ttl_ms), _now_ms())
            body = {
                "compare": [ops.absent(names.lease)],
                "success": [ops.put(names.lease, value, granted.id), ops.delete(names.preempt)],
                "failure": [
                    ops.txn(
                        ops.owned_by(names.lease, records.owner_prefix(owner)),
                        [
                            ops.put(names.lease, value, granted.id),
                            ops.get(names.preempt),
                            ops.get(names.lease),
                        ],
                        [ops.get(names.lease)],
                    )
                ],
            }
            try:
                # Sent again when unanswered: applied twice, the second is the same owner's
                # re-acquire (the same token).
                reply = self._txn(body, deadline, again=True)
            except LeaseNotFound:
                self._process.get().leases.forget(granted)
                continue
            break
        else:  # pragma: no cover - a lease granted a moment ago expired at once
            raise LeaseNotFound(f"{self}: a lease granted for {key!r} expired at once")
        revision = int(reply["header"]["revision"])
        preempted = False
        if reply.get("succeeded"):
            token = revision  # the key's create_revision: the Txn's own revision
        else:
            nested = reply["responses"][0]["response_txn"]
            found = self._decoded(ops.kvs(nested["responses"][-1]))
            if not nested.get("succeeded"):
                if found is None:
                    return None  # gone since the compare: the caller tries again
                self._refuse_permits(key, found)
                return found.holder()
            assert found is not None
            token = found.token
            preempted = names_token(ops.kvs(nested["responses"][1]), token)
        watch = self._process.get().watch
        lag = self._outlives(granted, since, deadline)
        if lag is None:
            return None  # the shared lease expired right after the Txn: the key is gone
        watch.hold(names.lease, owner, token, granted.id, revision, preempted=preempted, lag=lag)
        return token

    def acquired_lag(self, key: str, owner: str) -> float:
        """No I/O: a key put on a shared lease kept alive shortly before the acquire lives
        until that lease's expiry, up to a renewal period less than its ttl from the send."""
        own = self._process.get().watch.own.get(self.layout.names(key).lease)
        return own.lag if own is not None and own.owner == owner else 0.0

    def _refuse_permits(self, key: str, found: Record) -> None:
        if found.owner == PERMITS_OWNER and found.permits is not None:
            raise PermitsMismatchError(key, 1, found.permits)
        if found.base is not None and found.permit is not None:
            raise PermitsMismatchError(key, 1, found.permits or 1)

    def renew(self, key: str, owner: str, ttl_ms: int, *, timeout: float | None = None) -> Renewed:
        """One Txn checking the owner (moving the key onto the shared lease of ``ttl_ms`` if it
        is on another) and reading its preempt request, then one keepalive of that lease."""
        return self.renew_many([(key, owner, ttl_ms)], timeout=timeout)[0]

    def renew_many(
        self, leases: Sequence[tuple[str, str, int]], *, timeout: float | None = None
    ) -> list[Renewed]:
        """Per shared lease: one heartbeat put, answered from the watch once it has seen it
        (every change to this process's keys before it seen), then one keepalive: two round
        trips for any number of keys. Keys the watch cannot vouch for (known before it started,
        on another lease, or when it lags) are read in Txns of up to ``BATCH`` keys."""
        deadline = self._deadline(timeout)
        process = self._process.get()
        results: list[Renewed] = [False] * len(leases)
        groups: dict[int, list[int]] = {}
        for index, (_, _, ttl_ms) in enumerate(leases):
            groups.setdefault(process.leases.effective_s(ttl_ms), []).append(index)
        for indexes in groups.values():
            ttl_ms = leases[indexes[0]][2]
            try:
                granted = self._shared(ttl_ms, deadline)
                answers = self._renew_group(
                    [leases[index][:2] for index in indexes], granted, deadline
                )
            except LeaseNotFound:
                continue  # the shared lease expired, and every key on it: all refused
            for index, answer in zip(indexes, answers, strict=True):
                results[index] = answer
        return results

    def release(self, key: str, owner: str, *, timeout: float | None = None) -> bool:
        """One Txn guarded on the owner. When it fails, the key may still be on the process's
        shared etcd lease: :meth:`forsake` retires that lease, so the key lapses at its ttl."""
        try:
            return self._release(key, owner, timeout)
        except StoreError:
            self.forsake(key, owner)
            raise

    def forsake(self, key: str, owner: str) -> None:
        """No I/O: the shared etcd lease ``key`` is on (as this process's watch last saw it) is
        retired, so that no keepalive extends the key any more and it lapses at the lease's
        expiry; the process's next renewals move its other keys on that lease onto a new one
        (read and moved, guarded on their owners: one more Txn or two, once)."""
        process = self._process.get()
        name = self.layout.names(key).lease
        own = process.watch.own.get(name)
        if own is None or own.owner != owner:
            return
        granted = process.leases.by_id(own.lease)
        if granted is not None:
            process.leases.forget(granted)
        process.watch.drop(name)

    def _release(self, key: str, owner: str, timeout: float | None) -> bool:
        if isinstance(key, Slot):  # the key's record follows (permits.py)
            return self._release_slot(key, owner, self._deadline(timeout))
        names = self.layout.names(key)
        owned = ops.owned_by(names.lease, records.owner_prefix(owner))
        body = {"compare": owned, "success": [ops.delete(names.lease), ops.delete(names.preempt)]}
        reply = self._txn(body, self._deadline(timeout))
        if reply.get("succeeded"):
            self._process.get().watch.drop(names.lease)
        return bool(reply.get("succeeded"))

    def end(
        self, key: str, owner: str, how: ReleaseReason, *, timeout: float | None = None
    ) -> bool:
        """:meth:`release` (etcd keeps no ended keys, so ``how`` is not kept)."""
        return self.release(key, owner, timeout=timeout)

    def leave(
        self, key: str, owner: str, ttl_ms: int, how: LeaveReason, *, timeout: float | None = None
    ) -> bool:
        """The key moved onto a lease of its own of ``ttl_ms`` (effective), which nobody renews:
        one grant and one Txn guarded on the owner. ``how`` is not kept."""
        deadline = self._deadline(timeout)
        return self._strand(key, owner, self.effective_ttl_ms(ttl_ms) / 1000, deadline)

    def preempt(self, key: str, *, timeout: float | None = None) -> int | None:
        """Two round trips: the lease read (its token), then the request written in a Txn
        guarded on that token (read again if the key changed meanwhile)."""
        deadline = self._deadline(timeout)
        names = self.layout.names(key)
        while True:
            reply = self._txn({"compare": [], "success": [ops.get(names.lease)]}, deadline)
            record = self._decoded(ops.kvs(reply["responses"][0]))
            if record is None:
                return None
            if record.owner == PERMITS_OWNER and record.base is None:
                return self._preempt_slots(key, deadline)  # its oldest slot is asked
            body = {
                "compare": [ops.created_at(names.lease, record.token)],
                "success": [ops.put(names.preempt, str(record.token).encode())],
            }
            if self._txn(body, deadline).get("succeeded"):
                return record.token

    # Notices, listing, operators' and testing aids.

    def wait_for_release(self, key: str, timeout: float) -> bool:
        """Up to ``timeout`` on the process's watch for the deletion of the key's lease (a
        release, a force-release, or an expiry: etcd deletes a lease's keys as it expires, so
        waiters are woken then too). Never raises: while the watch fails, sleeps out
        ``timeout`` and returns ``False``."""
        names = self.layout.names(key)
        woken = self._process.get().watch.wait_deleted(names.lease, max(timeout, 0))
        if woken is None:
            time.sleep(max(timeout, 0))
            return False
        return woken

    def leases(self, *, include_inactive: bool = False) -> list[LeaseInfo]:
        """Held leases (etcd keeps no ended ones): one range of the prefix per 1,000 keys, one
        ``timetolive`` per etcd lease found (its time left is each key's ``expires_in``)."""
        found = self._summaries(list(self._range(self.layout.leases)))
        left = self._time_left({record.lease for record in found})
        return sorted((record.info(*left.get(record.lease, (None, None))) for record in found),
                      key=lambda info: info.key)  # fmt: skip

    def lease(self, key: str, *, include_inactive: bool = False) -> LeaseInfo | None:
        """Two round trips: the key read, then its etcd lease's time left."""
        deadline = self._deadline(None)
        name = self.layout.names(key).lease
        reply = self._txn({"compare": [], "success": [ops.get(name)]}, deadline)
        record = self._decoded(ops.kvs(reply["responses"][0]))
        if record is None:
            return None
        if record.owner == PERMITS_OWNER and record.base is None:
            record = self._summary(record, deadline)  # a key's record: its slots' tokens
        return record.info(*self._time_left({record.lease}).get(record.lease, (None, None)))

    def prune(self, older_than_ms: int, *, dry_run: bool = False) -> int:
        """Nothing to prune: etcd deletes a key as its lease ends. Returns 0."""
        check_older_than(older_than_ms)
        return 0

    def clear(self) -> None:
        """Deletes every lease, preempt request and tick record under the prefix (tokens keep
        growing: they are revisions of the whole cluster)."""
        deadline = self._deadline(None)
        layout = self.layout
        success = [
            {"request_delete_range": {"key": ops.b64(p), "range_end": ops.b64(ops.range_end(p))}}
            for p in (layout.leases, layout.preempts, layout.ticks)
        ]
        self._txn({"compare": [], "success": success}, deadline)

    def force_release(self, key: str) -> bool:
        """One Txn for a plain lease; a key held by permits, or a slot, as ``permits.py``
        says (every slot and the record; a slot alone, its record following)."""
        return self._force_release(key)

    def force_end(self, key: str, by: str) -> bool:
        """:meth:`force_release` (``by`` is not kept: etcd keeps no ended keys)."""
        return self.force_release(key)

    def close(self) -> None:
        """Ends this process's watch and closes its connections (the next call reconnects, and
        a renewal or a waiter starts the watch again). The etcd leases stay: locks held are
        still renewed by their renewers."""
        process = self._process.peek()
        if process is not None:
            process.watch.stop()
            process.wire.close()

    @classmethod
    def check_options(cls, options: dict[str, Any]) -> list[Any]:
        """E301-E303: ``endpoints``, ``prefix`` or ``timeout`` refused (no I/O)."""
        return checks.option_messages(options)

    def check(self, *, databases: Iterable[str] | None = None, deploy: bool = False) -> list[Any]:
        """W301-W307 (``--deploy`` / ``--database``): the cluster's health, its version, and
        ``LOCKS["TTL"]`` against the effective ttl."""
        if not deploy and not databases:
            return []
        return checks.store_messages(self)


def _stop_watch(process: runtime.ProcessLocal[Process]) -> None:
    held = process.peek()
    if held is not None:
        held.watch.stop(wait=False)


def _now_ms() -> int:
    return int(time.time() * 1000)


def _endpoint(url: str) -> tuple[str, str, int]:
    """``(scheme, host, port)`` of a URL ``checks.endpoints_problem`` accepted."""
    parts = urlsplit(url)
    assert parts.hostname is not None
    return parts.scheme, parts.hostname, parts.port or 2379
