"""One watch per process on the store's prefix: release notices, and what ``renew_many`` knows
of this process's own keys without reading them.

The watch streams every change under ``<prefix>/`` from a known revision. It wakes the waiters
of a key whose lease was deleted (a release, a force-release, an expiry: spurious wake-ups are
allowed), and marks a key this process holds as lost when it is deleted or created anew (another
token), and as preempted when a preempt request names its token. What it has seen is complete
from ``start`` on: a key known at a revision at or after it (its acquire's, or a read's) is
covered. Before answering from it, ``renew_many`` writes its heartbeat and waits until the
watch has seen that write: every change before it has then been seen.

The stream is read with a read timeout and made again from the next revision (no change is
missed); etcd3gw's ``Watcher`` reads without one and ends silently, so the stream is read here,
through the client's session and URL. A compaction past the next revision starts it afresh
(``start`` moves: keys known before are read again by ``renew_many``).
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import logging
import socket
import threading
import time
from typing import Any

import requests
import urllib3

from django_locks.policy import POLICY
from django_locks.stores.etcd.wire import Wire, b64, range_end

logger = logging.getLogger("django_locks")


@dataclasses.dataclass
class Own:
    """A key this process holds, as the watch last saw it."""

    owner: str
    token: int
    lease: int
    known_at: int
    lost: bool = False
    preempted: bool = False
    permits: int | None = None  # a slot's: its key's permits value (what its record holds)
    lag: float = 0.0  # seconds before its acquire's send its life began (``_outlives``)


class Watch:
    """The watch of one store in this process (started on first use, a daemon thread)."""

    def __init__(self, wire: Wire, root: bytes, leases: bytes, preempts: bytes) -> None:
        self._wire = wire
        self._root = root
        self._leases = leases
        self._preempts = preempts
        self._cond = threading.Condition()
        self._waiters: dict[bytes, int] = {}  # lease key -> waiters
        self._woken: dict[bytes, int] = {}  # lease key -> deletions seen (a counter)
        self.own: dict[bytes, Own] = {}
        self.start = -1  # complete from this revision on (-1: not yet)
        self.seen = 0  # the last revision whose events were all delivered
        self.failing = False
        self._thread: threading.Thread | None = None
        self._stopped = False
        self._response: Any = None  # the stream being read, closed by stop()

    # What the store asks.

    def ensure(self) -> None:
        """Start the watch thread, unless it runs (a thread that died is started again)."""
        with self._cond:
            self._stopped = False
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(
                    target=self._run, name="django_locks etcd watch", daemon=True
                )
                self._thread.start()

    def hold(
        self,
        lease_key: bytes,
        owner: str,
        token: int,
        lease: int,
        revision: int,
        *,
        preempted: bool = False,
        permits: int | None = None,
        lag: float = 0.0,
    ) -> None:
        """Record ``lease_key`` as this process's, as read at ``revision`` (its lease and
        whether a preempt request names its token, both read then). Changes the watch delivers
        from revisions up to ``revision`` are older than this and ignored for it."""
        with self._cond:
            self.own[lease_key] = Own(
                owner, token, lease, revision, preempted=preempted, permits=permits, lag=lag
            )
        self.ensure()

    def drop(self, lease_key: bytes) -> None:
        with self._cond:
            self.own.pop(lease_key, None)

    def covered(self, own: Own) -> bool:
        return self.start >= 0 and own.known_at >= self.start

    def through(self, revision: int, timeout: float) -> bool:
        """Wait until every change up to ``revision`` was delivered; ``False`` at the timeout."""
        give_up = time.monotonic() + timeout
        with self._cond:
            while self.seen < revision:
                left = give_up - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(left)
            return True

    def wait_deleted(self, lease_key: bytes, timeout: float) -> bool | None:
        """Wait up to ``timeout`` for the deletion of ``lease_key``; ``None`` while the watch
        is not running (no notices)."""
        self.ensure()
        give_up = time.monotonic() + timeout
        with self._cond:
            if self.failing:
                return None
            before = self._woken.get(lease_key, 0)
            self._waiters[lease_key] = self._waiters.get(lease_key, 0) + 1
            try:
                while self._woken.get(lease_key, 0) == before:
                    left = give_up - time.monotonic()
                    if left <= 0:
                        return False
                    self._cond.wait(left)
                return True
            finally:
                self._waiters[lease_key] -= 1
                if not self._waiters[lease_key]:
                    del self._waiters[lease_key]
                    self._woken.pop(lease_key, None)

    # The stream.

    def _run(self) -> None:
        failures = 0
        while not self._stopped:
            try:
                self._stream()
                failures = 0
            except Exception as exc:  # the thread must outlive every failure
                if self._stopped:
                    return
                if _read_timed_out(exc):
                    # No line for etcd_watch_read seconds: the planned remake (a quiet prefix,
                    # or a member that stopped answering), from the next revision; not a failure.
                    continue
                failures += 1
                with self._cond:
                    first, self.failing = not self.failing, True
                    self._cond.notify_all()
                if first:
                    logger.warning(
                        "The etcd watch of %s failed (%s): waiters sleep through their backoff "
                        "and renewals read their keys until it works again",
                        self._wire.what,
                        exc,
                    )
                time.sleep(POLICY.etcd_watch_retry(failures))

    def _stream(self) -> None:
        index = self._wire.preferred
        client = self._wire.client(index)
        # After a failure the auth token is asked for afresh (it may be what expired).
        self._wire.authorize(client, POLICY.etcd_watch_connect, afresh=self.failing)
        request: dict[str, Any] = {"key": b64(self._root), "range_end": b64(range_end(self._root))}
        if self.start >= 0:
            request["start_revision"] = str(self.seen + 1)
        with client.session.post(
            client.get_url("watch"),
            json={"create_request": request},
            stream=True,
            timeout=(POLICY.etcd_watch_connect, POLICY.etcd_watch_read),
            **self._wire.security.per_request,
        ) as response:
            self._response = response
            if self._stopped:
                return
            response.raise_for_status()
            for line in response.iter_lines(chunk_size=65536):
                if line.strip():
                    self._handle(json.loads(line))

    def _handle(self, chunk: dict[str, Any]) -> None:
        result = chunk.get("result")
        if result is None:
            raise RuntimeError(f"the watch stream ended: {chunk.get('error', chunk)}")
        revision = int(result.get("header", {}).get("revision", 0))
        if int(result.get("compact_revision", 0) or 0):
            with self._cond:
                self.start = -1  # compacted past the next revision: start afresh
            raise RuntimeError("the watch's next revision was compacted")
        if result.get("canceled"):
            raise RuntimeError(f"the watch was canceled: {result.get('cancel_reason', '')}")
        if result.get("created"):
            with self._cond:
                if self.start < 0:
                    self.start = self.seen = revision
                if self.failing:
                    self.failing = False
                    logger.info("The etcd watch of %s works again", self._wire.what)
                self._cond.notify_all()
            return
        with self._cond:
            for event in result.get("events", ()):
                self._event(event)
            events = result.get("events") or ()
            if events:
                self.seen = max(self.seen, max(int(e["kv"]["mod_revision"]) for e in events))
            self._cond.notify_all()

    def _event(self, event: dict[str, Any]) -> None:
        kv = event["kv"]
        name = base64.b64decode(kv["key"])
        deleted = event.get("type") == "DELETE"
        if name.startswith(self._leases):
            # A slot's deletion (``l/K#<n>``) wakes the waiters of its key too (spurious
            # wake-ups are allowed: a plain key named so wakes them as well).
            for waited in (name, self._base_of(name)) if deleted else ():
                if waited is not None and waited in self._waiters:
                    self._woken[waited] = self._woken.get(waited, 0) + 1
            own = self.own.get(name)
            if own is not None and int(kv.get("mod_revision", 0)) > own.known_at:
                if deleted or int(kv.get("create_revision", 0)) != own.token:
                    own.lost = True
                else:
                    own.lease = int(kv.get("lease", 0))
        elif name.startswith(self._preempts) and not deleted:
            own = self.own.get(self._leases + name[len(self._preempts) :])
            if (
                own is not None
                and int(kv.get("mod_revision", 0)) > own.known_at
                and base64.b64decode(kv.get("value", "")) == str(own.token).encode()
            ):
                own.preempted = True

    def _base_of(self, name: bytes) -> bytes | None:
        """The lease key of the key whose slot ``name`` would be (``l/K`` of ``l/K#3``)."""
        base, sep, permit = name.rpartition(b"#")
        if sep and permit.isdigit() and len(base) > len(self._leases):
            return base
        return None

    def stop(self, *, wait: bool = True) -> None:
        """End the thread (``EtcdStore.close()``): the next use starts it again, from the next
        revision, so nothing is missed for the keys held meanwhile."""
        with self._cond:
            self._stopped = True
            response, thread = self._response, self._thread
        if response is not None:
            # Shut the socket down first (as etcd3gw's Watcher.stop does): close() alone waits
            # for the reading thread's read, up to the read timeout.
            with contextlib.suppress(Exception):
                sock = socket.fromfd(response.raw._fp.fileno(), socket.AF_INET, socket.SOCK_STREAM)
                sock.shutdown(socket.SHUT_RDWR)
                sock.close()
            response.close()
        if wait and thread is not None and thread is not threading.current_thread():
            thread.join(timeout=1)


def _read_timed_out(exc: BaseException) -> bool:
    """Whether the stream ended by its read timeout (requests raises ``ReadTimeout`` while it
    waits for the answer, ``ConnectionError`` wrapping urllib3's ``ReadTimeoutError`` within
    the stream)."""
    if isinstance(exc, requests.exceptions.ReadTimeout):
        return True
    return isinstance(exc, requests.exceptions.ConnectionError) and any(
        isinstance(arg, urllib3.exceptions.ReadTimeoutError) for arg in exc.args
    )
