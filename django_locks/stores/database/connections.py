"""One connection of the database store's own: opened, watched, abandoned, closed.

``DatabaseStore`` never uses the connection Django gives a request (its writes would join the
request's transaction). It opens driver connections of its own from the alias's
``settings_dict``, through a private instance of the alias's backend (so psycopg 3, psycopg2,
SQLite, their options and ``connection_created`` receivers all apply), in autocommit.

The stores' watchdog thread (``stores/runtime.py``) enforces every call's deadline; the thread
doing the I/O never does. At the deadline it shuts the connection's socket down, which wakes
the caller at once even when the server is unreachable, and sends the server a cancel request
from a thread of its own so that no statement keeps running there; the connection is then
discarded. ``pools.py`` hands the connections out.
"""

from __future__ import annotations

import contextlib
import math
import os
import socket
import threading
from typing import Any

from django.db import connections

CANCEL_TIMEOUT = 5.0
"""Seconds the cancel request of an abandoned call may take (it runs on a thread of its own)."""

CANCEL_GRACE = 0.02
"""Seconds the watchdog gives the cancel request before it shuts the connection's socket down."""


class PrivateBackend:
    """A private instance of an alias's backend, for connections of the store's own (the calls'
    and the ``LISTEN`` session's): the alias's current ``settings_dict`` (test databases
    included), read when this is made, without Django's connection pool, ``option_defaults``
    filling options the settings leave unset."""

    def __init__(self, using: str, **option_defaults: Any) -> None:
        base = connections[using]
        options = {k: v for k, v in base.settings_dict["OPTIONS"].items() if k != "pool"}
        for name, value in option_defaults.items():
            options.setdefault(name, value)
        self.using = using
        self.wrapper_class = type(base)
        self.settings_dict = {**base.settings_dict, "OPTIONS": options}

    def connect(self) -> Any:
        """A driver connection in autocommit. The wrapper is made on the calling thread (Django's
        wrappers refuse to be used from another thread than their creator's)."""
        wrapper: Any = self.wrapper_class(self.settings_dict, self.using)
        try:
            wrapper.connect()
            if not wrapper.get_autocommit():
                wrapper.set_autocommit(True)
        except BaseException:
            if wrapper.connection is not None:
                # Opened, then refused (pytest-django's blocker refuses inside connect()'s own
                # set_autocommit): left open, it would keep the test database from being dropped.
                with contextlib.suppress(Exception):
                    wrapper.connection.close()
            raise
        return wrapper.connection


class StoreConnection:
    """One driver connection of a store (or, for SQLite in memory, Django's own)."""

    def __init__(self, raw: Any, *, vendor: str, owned: bool) -> None:
        self.raw = raw
        self.vendor = vendor
        self.owned = owned
        self.psycopg2 = type(raw).__module__.startswith("psycopg2")
        self.fd = raw.fileno() if vendor == "postgresql" else -1
        self.thread = threading.current_thread()
        self.name = ""  # the database name it was opened on
        self.cursor: Any = None
        self.deadline = math.inf
        self.busy = False
        self.fired = False  # the watchdog abandoned the call running on it
        self.close_requested = False
        self.closed = False
        self._close_lock = threading.Lock()
        self._unsettled = {"call", "cancel", "shutdown"}  # of an abandoned call

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if not self.owned:
            return  # Django's own connection: Django closes it
        with contextlib.suppress(Exception):  # a broken connection may complain; it is gone
            self.raw.close()

    def abandon(self) -> None:
        """Watchdog side, at the deadline, while the call still runs on another thread."""
        self.fired = True
        if self.vendor == "sqlite":
            if self.owned and not self.closed:
                # The call may have ended (and its connection been closed) just now: the
                # watchdog abandons outside its lock, after marking the call fired.
                with contextlib.suppress(Exception):
                    self.raw.interrupt()
            return
        # First the cancel request, from a thread of its own (it is network I/O): the server
        # stops the statement instead of leaving it queued behind a row lock. It must go out
        # before the socket is shut down, since both drivers refuse to cancel on a connection
        # they have seen fail. Then, after a short grace whether or not the cancel got through,
        # the shutdown wakes the caller even when the server does not answer at all.
        sent = threading.Event()
        threading.Thread(
            target=self._cancel, args=(sent,), name="django_locks-cancel", daemon=True
        ).start()
        sent.wait(CANCEL_GRACE)
        try:
            # A socket object of our own on a duplicate descriptor: shutdown() acts on the
            # connection, close() only on the duplicate.
            with socket.socket(fileno=os.dup(self.fd)) as sock:
                sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._settled("shutdown")

    def _cancel(self, sent: threading.Event) -> None:
        try:
            if self.psycopg2:
                self.raw.cancel()
            else:
                self.raw.cancel_safe(timeout=CANCEL_TIMEOUT)
        except Exception:  # best effort: the shutdown still ends the call
            pass
        finally:
            sent.set()
        self._settled("cancel")

    def discard(self) -> None:
        """Caller side: never use it again. An abandoned one is closed only once its cancel was
        sent and its socket shut down (closing earlier would free what they still use)."""
        if not self.fired or self.vendor == "sqlite":
            self.close()
        else:
            self._settled("call")

    def _settled(self, party: str) -> None:
        with self._close_lock:
            self._unsettled.discard(party)
            close_now = not self._unsettled
        if close_now:
            self.close()


class ConnectAttempt:
    """Connecting on a thread of its own: abandoned at the deadline, closed if it completes late."""

    def __init__(self, backend: PrivateBackend) -> None:
        self.backend = backend
        self.done = threading.Event()
        self.lock = threading.Lock()
        self.abandoned = False
        self.raw: Any = None
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            raw = self.backend.connect()
        except BaseException as exc:
            self.error = exc
            raw = None
        with self.lock:
            self.raw = raw
            self.done.set()
            late = self.abandoned
        if late and raw is not None:
            raw.close()

    def abandon(self) -> bool:
        """``True`` when the attempt was still running (it is now abandoned)."""
        with self.lock:
            if self.done.is_set():
                return False
            self.abandoned = True
            return True
