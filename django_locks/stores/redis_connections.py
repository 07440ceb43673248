"""The Redis store's own connections: a pool per server and process, and the wire.

redis-py opens each connection (TLS, ``AUTH``, ``SELECT``, every URL option); the store then
writes its commands and reads their replies on the socket itself, in RESP2. The few lines of
Python between a lock's two round trips are most of its cost on top of them
(``docs/topics/performance.rst``), so a lock's call is one ``sendall`` and one ``recv``. Imported
by ``stores/redis.py`` only: redis-py is an optional dependency.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from typing import Any

import redis.exceptions

from django_locks.exceptions import StoreTimeoutError


class PooledConnection:
    """One connection of a pool: redis-py's, connected on first use, and the store's reads and
    writes on its socket."""

    __slots__ = ("_conn", "_poller", "_sock")

    def __init__(self, conn: Any) -> None:
        self._conn = conn
        self._sock: socket.socket | None = None
        self._poller: Any = None

    def ready(self, deadline: float, connect_timeout: float, socket_timeout: float) -> None:
        """Connect, or reconnect a pooled connection the server has closed (a restart, a
        client timeout): it reads as EOF at once, before anything was sent."""
        if self._sock is not None:
            if not self._poller.poll(0):
                return
            self.close()
        left = remaining(deadline)
        conn = self._conn
        conn.socket_connect_timeout = min(connect_timeout, left)
        conn.socket_timeout = min(socket_timeout, left)
        conn.connect()
        self._sock = sock = conn._sock
        self._poller = _Poller(sock)

    def call(self, command: bytes, deadline: float) -> Any:
        """Send one command (in RESP) and read its reply; an error reply is raised."""
        assert self._sock is not None
        sock = self._sock
        sock.settimeout(remaining(deadline))
        sock.sendall(command)
        data = sock.recv(65536)
        if data[:1] == b":" and data.find(b"\r\n") == len(data) - 2:
            return int(data[1:-2])  # the reply of a lock's every call but a refused acquire
        (reply,) = Replies(sock, deadline, data).read(1)
        if isinstance(reply, redis.exceptions.ResponseError):
            raise reply
        return reply

    def exchange(self, commands: bytes, count: int, deadline: float) -> list[Any]:
        """Send ``count`` commands (in RESP) in one write and read their replies: one round
        trip. An error reply comes back as its exception, in place."""
        assert self._sock is not None
        self._sock.settimeout(remaining(deadline))
        self._sock.sendall(commands)
        return Replies(self._sock, deadline, b"").read(count)

    def close(self) -> None:
        self._sock = self._poller = None
        self._conn.disconnect()


class _Poller:
    """Whether a socket has something to read, without reading: one poll(2) where available."""

    __slots__ = ("_poll", "_sock")

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._poll: Any = None
        if hasattr(select, "poll"):
            self._poll = select.poll()
            self._poll.register(sock, select.POLLIN)

    def poll(self, timeout: float) -> bool:
        if self._poll is not None:
            return bool(self._poll.poll(timeout))
        return bool(select.select([self._sock], [], [], timeout)[0])


class Pool:
    """At most ``size`` connections to one server, for one process; callers wait their deadline."""

    def __init__(self, kwargs: dict[str, Any], connection_class: type[Any], size: int) -> None:
        self._kwargs = kwargs
        self._class = connection_class
        self._idle: list[PooledConnection] = []
        self._size = size
        self._open = 0  # connections made and not discarded: idle or in use
        self._waiting = 0
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)

    def get(self, deadline: float) -> PooledConnection:
        """A connection (not connected yet when new); ``StoreTimeoutError`` past ``deadline``."""
        try:
            return self._idle.pop()  # atomic: the usual case takes no lock
        except IndexError:
            pass
        with self._cond:
            while True:
                try:
                    return self._idle.pop()
                except IndexError:
                    pass
                if self._open < self._size:
                    self._open += 1
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StoreTimeoutError("No free Redis connection before the call's timeout.")
                self._waiting += 1
                try:
                    self._cond.wait(left)
                finally:
                    self._waiting -= 1
        return PooledConnection(self._class(**self._kwargs))

    def put(self, conn: PooledConnection) -> None:
        with self._lock:
            self._idle.append(conn)
            if self._waiting:
                self._cond.notify()

    def discard(self, conn: PooledConnection) -> None:
        conn.close()
        with self._lock:
            self._open -= 1
            if self._waiting:
                self._cond.notify()

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
            self._open -= len(idle)
        for conn in idle:
            conn.close()


def bulk(arg: bytes) -> bytes:
    """``arg`` as a RESP bulk string."""
    return b"$%d\r\n%s\r\n" % (len(arg), arg)


def pack(command: tuple[Any, ...]) -> bytes:
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


class Replies:
    """RESP2 replies as they arrive on one socket (after ``data``, read already), read before
    ``deadline``."""

    __slots__ = ("_buffer", "_deadline", "_position", "_sock")

    def __init__(self, sock: socket.socket, deadline: float, data: bytes) -> None:
        self._sock = sock
        self._deadline = deadline
        self._buffer = data
        self._position = 0

    def read(self, count: int) -> list[Any]:
        """The next ``count`` replies: all the server sent (anything more is out of step)."""
        replies = [self._next() for _ in range(count)]
        if self._position != len(self._buffer):
            raise redis.exceptions.InvalidResponse("Protocol error: more replies than commands")
        return replies

    def _next(self) -> Any:
        line = self._line()
        kind, rest = line[:1], line[1:]
        if kind == b"+":
            return rest
        if kind == b"-":
            return _error(rest.decode(errors="replace"))
        try:
            if kind == b":":
                return int(rest)
            if kind == b"$":
                return None if rest == b"-1" else self._bulk(int(rest))
            if kind == b"*":
                return None if rest == b"-1" else [self._next() for _ in range(int(rest))]
        except ValueError:
            pass  # not a number where one must be
        raise redis.exceptions.InvalidResponse(f"Protocol error, got {line[:40]!r}")

    def _line(self) -> bytes:
        while (end := self._buffer.find(b"\r\n", self._position)) < 0:
            self._receive()
        line = self._buffer[self._position : end]
        self._position = end + 2
        return line

    def _bulk(self, size: int) -> bytes:
        while len(self._buffer) - self._position < size + 2:
            self._receive()
        data = self._buffer[self._position : self._position + size]
        self._position += size + 2
        return data

    def _receive(self) -> None:
        if self._position:
            self._buffer, self._position = self._buffer[self._position :], 0
        self._sock.settimeout(remaining(self._deadline))
        chunk = self._sock.recv(65536)
        if not chunk:
            raise redis.exceptions.ConnectionError("Redis closed the connection.")
        self._buffer += chunk


_ERRORS: dict[str, type[redis.exceptions.ResponseError]] = {
    "NOSCRIPT": redis.exceptions.NoScriptError,
    "MOVED": redis.exceptions.MovedError,
    "ASK": redis.exceptions.AskError,
}


def _error(text: str) -> redis.exceptions.ResponseError:
    """The exception redis-py raises for the error reply ``text`` (those the store tells apart;
    every other one is a ``ResponseError`` with the server's message)."""
    code, _, rest = text.partition(" ")
    error_class = _ERRORS.get(code)
    return redis.exceptions.ResponseError(text) if error_class is None else error_class(rest)


def remaining(deadline: float) -> float:
    """Seconds left before ``deadline``; ``StoreTimeoutError`` once it passed."""
    left = deadline - time.monotonic()
    if left <= 0:
        raise StoreTimeoutError("The Redis call's timeout passed.")
    return left
