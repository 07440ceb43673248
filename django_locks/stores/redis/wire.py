"""The Redis store's wire: its own connections, on redis-py's public API, and its calls.

A connection is a redis-py ``Connection``; a call is ``send_packed_command`` of bytes packed
once and ``read_response`` of each reply, one round trip. The call's deadline is kept by the
process's watchdog (``stores/runtime.py``), never by the thread doing the I/O: at the deadline
it calls the connection's public ``disconnect()``, the blocked read fails at once, the call
raises ``StoreTimeoutError`` and the connection is discarded.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from typing import Any

import redis.exceptions

from django_locks.durations import MAX_DURATION_MS
from django_locks.exceptions import StoreError, StoreTimeoutError
from django_locks.stores import runtime
from django_locks.stores.redis import options
from django_locks.stores.redis.cluster import Node, Topology
from django_locks.stores.redis.scripts import Script, pack, script_load, verb

ERRORS = (redis.exceptions.RedisError, OSError)
logger = logging.getLogger("django_locks")
_ASKING = pack("ASKING")

MAX_CALL_TIMEOUT = MAX_DURATION_MS / 1000
"""The longest bound of one call, in seconds (366 days): the longest a lock's call may take."""


class Link:
    """One connection of a pool, and the call running on it (a ``runtime.Call``).

    Holds a redis-py ``Connection``, made anew when the previous one failed or the server closed
    it, each made with a connect timeout no longer than the call's time left."""

    __slots__ = ("__weakref__", "conn", "deadline", "fired", "pool")

    def __init__(self, pool: Pool) -> None:
        self.pool = pool
        self.conn: Any = None
        self.deadline = 0.0
        self.fired = False

    def abandon(self) -> None:
        # The watchdog thread, at the deadline: disconnect() shuts the socket down, so the send
        # or read blocked on it in the caller's thread fails at once. redis-py's own cleanup in
        # that thread may race with this one; whichever comes second finds nothing to close.
        conn = self.conn
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.disconnect()

    def handshake(self, conn: Any) -> None:
        """redis-py's handshake (``AUTH``, ``SELECT``, ...), refused once the call was
        abandoned: a ``Connection`` reconnects by itself in ``send_packed_command``, and a call
        past its deadline must not start over."""
        if self.fired:
            raise redis.exceptions.ConnectionError("The call was abandoned at its deadline.")
        conn.on_connect()

    def ready(self, deadline: float, *, check: bool = True) -> Any:
        """The connection, connected. With ``check``, a pooled one the server has closed
        meanwhile (a restart, ``CLIENT KILL``, an idle timeout) reads as EOF at once, before
        anything was sent, and is replaced, so that no call is lost to it."""
        conn = self.conn
        if conn is not None:
            if not check:
                return conn
            try:
                if not conn.can_read(0):
                    return conn
            except ERRORS:
                pass
            self.close()
        pool = self.pool
        connect_timeout = min(pool.connect_timeout, max(deadline - time.monotonic(), 0.001))
        conn = self.conn = pool.connection_class(
            **pool.kwargs, socket_connect_timeout=connect_timeout, redis_connect_func=self.handshake
        )
        conn.connect()
        return conn

    def close(self) -> None:
        conn, self.conn = self.conn, None
        if conn is not None:
            conn.disconnect()


class Pool:
    """At most ``size`` connections to one server (``where``: ``host:port`` or a socket path),
    for one process; callers wait their deadline for one."""

    def __init__(
        self,
        where: str,
        kwargs: dict[str, Any],
        connection_class: type[Any],
        connect_timeout: float,
        size: int,
    ) -> None:
        self.where = where
        self.what = f"Redis at {where}"  # in error messages
        self.kwargs = kwargs
        self.connection_class = connection_class
        self.connect_timeout = connect_timeout
        self._idle: list[Link] = []
        self._size = size
        self._open = 0  # links made and not discarded: idle or in use
        self._waiting = 0
        self._cond = threading.Condition(threading.Lock())

    def idle(self) -> int:
        return len(self._idle)

    def call(
        self, command: bytes, deadline: float, script: Script | None = None, *, resend: bool = True
    ) -> Any:
        """Run ``command`` (in RESP) before ``deadline`` and return its reply; a ``script``
        call loads its script on NOSCRIPT and runs again.

        A pooled connection the server has closed meanwhile (a restart, ``CLIENT KILL``, an
        idle timeout) never fails a call: it is replaced before sending (``Link.ready``), or,
        for an idempotent script, the call is sent again on a fresh connection when the pooled
        one fails (the check before sending releases the GIL once more, which costs a contended
        handoff more than a resend ever does).

        Raises ``AskError`` (a Cluster redirection) as it is, every other failure as a
        ``StoreError`` chained to redis-py's error (``StoreTimeoutError`` at the deadline). A
        connection that failed or was abandoned is discarded; one that got an error reply is in
        step and goes back to the pool."""
        resend = resend and script is not None and script.idempotent
        link = self._get(deadline)
        dog = runtime.watchdog()
        try:
            reused = link.conn is not None
            dog.watch(link, deadline)
            conn = link.ready(deadline, check=not resend)
            try:
                conn.send_packed_command((command,), check_health=False)
                reply = conn.read_response()
            except redis.exceptions.NoScriptError:
                # The server restarted or ran SCRIPT FLUSH: the script never ran, so loading
                # it and sending the same call again cannot run it twice (one round trip).
                if script is None:
                    raise
                conn.send_packed_command((script_load(script) + command,), check_health=False)
                # Both replies are read before either error is raised: a connection put back
                # with a reply still unread would hand it to the next call as its own.
                loaded, reply = _reply(conn), _reply(conn)
                for answer in (loaded, reply):
                    if isinstance(answer, redis.exceptions.ResponseError):
                        raise answer from None
        except BaseException as exc:
            fired = dog.unwatch(link)
            if (
                resend
                and reused
                and not fired
                and isinstance(exc, redis.exceptions.ConnectionError)
            ):
                self._discard(link)
                return self.call(command, deadline, script, resend=False)
            error = self._failed(link, fired, exc, command)
            if error is exc:
                raise
            raise error from exc
        self._done(link, dog.unwatch(link))
        return reply

    def asking(self, command: bytes, deadline: float, script: Script | None = None) -> Any:
        """``command`` after ``ASKING`` in the same write (a Cluster slot migrating to this
        node: the one command is served here); one round trip."""
        replies = self.pipeline([_ASKING, command], deadline)
        reply = replies[1]
        if isinstance(reply, redis.exceptions.NoScriptError) and script is not None:
            reply = self.pipeline([_ASKING, script_load(script), _ASKING, command], deadline)[3]
        if isinstance(reply, redis.exceptions.AskError):
            raise reply
        if isinstance(reply, BaseException):
            raise runtime.translated(reply, self.what, timed_out=False) from reply
        return reply

    def pipeline(self, commands: list[bytes], deadline: float) -> list[Any]:
        """Send ``commands`` (in RESP) in one write and read their replies (an error reply
        comes back as its exception, in place): one round trip."""
        link = self._get(deadline)
        dog = runtime.watchdog()
        try:
            dog.watch(link, deadline)
            conn = link.ready(deadline)
            conn.send_packed_command((b"".join(commands),), check_health=False)
            # Read whole, error replies in place: the connection stays in step.
            replies = [_reply(conn) for _ in commands]
        except BaseException as exc:
            error = self._failed(link, dog.unwatch(link), exc, commands[0])
            if error is exc:
                raise
            raise error from exc
        self._done(link, dog.unwatch(link))
        return replies

    def confirmed(
        self, command: bytes, wait: bytes, deadline: float, script: Script
    ) -> tuple[Any, int]:
        """``command`` (a ``script`` call) with ``WAIT`` after it in the same write (one round
        trip): its reply and how many replicas confirmed it (``min_replicas``). A flushed
        script is loaded and the pair sent again (the call never ran)."""
        answers = self.pipeline([command, wait], deadline)
        if isinstance(answers[0], redis.exceptions.NoScriptError):
            answers = self.pipeline([script_load(script), command, wait], deadline)[1:]
        reply, count = answers
        if isinstance(reply, BaseException):
            raise runtime.translated(reply, self.what, timed_out=False) from reply
        if isinstance(count, BaseException):
            # The script ran (a grant must be released): WAIT refused (renamed, denied by an
            # ACL) confirms nothing.
            logger.warning(
                "%s refused WAIT (%s): min_replicas cannot be confirmed there; allow WAIT for "
                "the store's user, or set min_replicas to 0.",
                self.what,
                count,
            )
            return reply, 0
        return reply, int(count)

    def _failed(self, link: Link, fired: bool, exc: BaseException, command: bytes) -> BaseException:
        # Every path that reads several replies reads them all before raising (_reply), so an
        # error reply here leaves nothing unread: the connection is in step.
        """What a failed call raises, its connection back in the pool or discarded."""
        if isinstance(exc, redis.exceptions.ResponseError) and not fired:
            self._put(link)  # an error reply: the connection is in step
            if isinstance(exc, redis.exceptions.AskError):
                return exc
            return runtime.translated(exc, self.what, timed_out=False)
        self._discard(link)
        if isinstance(exc, StoreError):
            return exc
        if fired or isinstance(exc, Exception):
            # Any error of the I/O (redis-py's, or its parser's on a garbled reply) is the
            # store's failure, never an answer. redis-py's own TimeoutError comes from a
            # connect timeout cut to the call's time left: the deadline, too.
            timed_out = fired or isinstance(exc, redis.exceptions.TimeoutError)
            what = f"{self.what} ({verb(command)})"
            return runtime.translated(exc, what, timed_out=timed_out)
        return exc

    def _done(self, link: Link, fired: bool) -> None:
        if fired:
            self._discard(link)  # the watchdog disconnected it just after the reply came
        else:
            self._put(link)

    def _get(self, deadline: float) -> Link:
        """A link (not connected yet when new); ``StoreTimeoutError`` past ``deadline``."""
        if deadline <= time.monotonic():
            raise StoreTimeoutError(
                f"The call's timeout had passed before it was sent to {self.what}."
            )
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
                    return Link(self)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise StoreTimeoutError(
                        f"No free connection to {self.what} before the call's timeout."
                    )
                self._waiting += 1
                try:
                    self._cond.wait(left)
                finally:
                    self._waiting -= 1

    def _put(self, link: Link) -> None:
        with self._cond:
            self._idle.append(link)
            if self._waiting:
                self._cond.notify()

    def _discard(self, link: Link) -> None:
        link.close()
        with self._cond:
            self._open -= 1
            if self._waiting:
                self._cond.notify()

    def close(self) -> None:
        """Close the idle connections (those in use close when they fail, or stay pooled)."""
        with self._cond:
            idle, self._idle = self._idle, []
            self._open -= len(idle)
        for link in idle:
            link.close()


def _reply(conn: Any) -> Any:
    """One reply read off ``conn``; an error reply is returned in place, not raised, so that
    the replies after it are read too."""
    try:
        return conn.read_response()
    except redis.exceptions.ResponseError as exc:
        return exc


class Connections:
    """The connections of one process (a ``ProcessLocal`` of the store: made afresh in a
    forked child, which never uses or closes the parent's): a pool per server and kind (lock
    calls, waits), and the Cluster's topology."""

    def __init__(self, store_options: options.Options) -> None:
        self.options = store_options
        self.pools: dict[tuple[str, Node | None], Pool] = {}
        self.topology: Topology | None = None
        self.lock = threading.Lock()

    def pool(self, kind: str, node: Node | None) -> Pool:
        with self.lock:
            pool = self.pools.get((kind, node))
            if pool is None:
                store = self.options
                kwargs = dict(store.connection_kwargs)
                if node is not None:
                    kwargs["host"], kwargs["port"] = node
                pool = self.pools[kind, node] = Pool(
                    options.where(kwargs, node),
                    kwargs,
                    store.connection_class,
                    store.socket_connect_timeout,
                    store.max_connections,
                )
            return pool

    def cluster(self) -> Topology:
        with self.lock:
            if self.topology is None:
                store = self.options
                assert store.url is not None  # Cluster refuses sentinels, so it has a URL
                self.topology = Topology(store.url, store.extra, store.socket_connect_timeout)
            return self.topology

    def close(self) -> None:
        with self.lock:
            pools, self.pools = self.pools, {}
            topology, self.topology = self.topology, None
        for pool in pools.values():
            pool.close()
        if topology is not None:
            topology.close()


class Calls:
    """The Redis store's calls, routed: each to the server serving its key (on Redis Cluster,
    following MOVED and ASK), within its deadline. ``RedisStore`` is one."""

    cluster: bool
    socket_timeout: float
    _process: runtime.ProcessLocal[Connections]

    @staticmethod
    def _left(deadline: float) -> float:  # a deadline's time left, as a timeout
        return max(deadline - time.monotonic(), 0)

    def _deadline(self, timeout: float | None) -> float:
        if timeout is None:
            timeout = self.socket_timeout
        # Capped at the longest ttl: a deadline past about 300 years overflows time_t.
        return time.monotonic() + min(timeout, MAX_CALL_TIMEOUT)

    def _pool(self, node: Node | None, kind: str = "ops") -> Pool:
        process = self._process.get()
        pool = process.pools.get((kind, node))
        return pool if pool is not None else process.pool(kind, node)

    def _routed(
        self, name: bytes, command: bytes, timeout: float | None, script: Script | None
    ) -> Any:
        """``command`` (a ``script`` call on the key named ``name``, or with ``None`` a plain
        command on it) on the server serving it."""
        deadline = self._deadline(timeout)
        if not self.cluster:
            return self._pool(None).call(command, deadline, script)

        def send(node: Node, asking: bool) -> Any:
            def on(pool: Pool) -> Any:
                if asking:
                    return pool.asking(command, deadline, script)
                return pool.call(command, deadline, script)

            return self._on_node(node, on)

        return self._process.get().cluster().routed(name, deadline, send)

    def _wait_call(self, wakeup: bytes, command: bytes, deadline: float) -> Any:
        """A BLPOP on the server serving ``wakeup``, on a wait connection; on Redis Cluster it
        follows MOVED and ASK as every call does (a slot migrating must not end a waiter with
        a redirection it cannot read)."""
        if not self.cluster:
            return self._pool(None, "wait").call(command, deadline)

        def send(node: Node, asking: bool) -> Any:
            def on(pool: Pool) -> Any:
                return pool.asking(command, deadline) if asking else pool.call(command, deadline)

            return self._on_node(node, on, purpose="wait")

        return self._process.get().cluster().routed(wakeup, deadline, send)

    def _on_node(self, node: Node | None, call: Any, *, purpose: str = "ops") -> Any:
        """``call(pool)`` on ``node``'s pool for ``purpose`` (lock calls, or waits); a Cluster
        node that failed (not an error reply) has the topology discovered again before the
        next call."""
        try:
            return call(self._pool(node, purpose))
        except StoreError as exc:
            cause = exc.__cause__  # None: no free connection, the node did not fail
            if node is not None and cause and not isinstance(cause, redis.exceptions.ResponseError):
                self._process.get().cluster().failed()
            raise

    def _node_for(self, name: bytes, deadline: float) -> Node | None:
        if not self.cluster:
            return None
        return self._process.get().cluster().node_for(name, deadline)

    def _primaries(self, deadline: float) -> list[Node | None]:
        if not self.cluster:
            return [None]
        return list(self._process.get().cluster().primaries(deadline))
