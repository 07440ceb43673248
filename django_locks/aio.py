"""How coroutines reach the store: calls in threads, finished whatever the cancellation, and waits
woken by the store's release notices.

Store calls never run on the event loop. A release is submitted to a thread before its first
await, so a cancellation cannot un-start it (``finish``); an acquire cancelled mid-call gives
back what it gets (``attempt``). Async waiters are woken by the store's release notices as
threads are (``ReleaseNotices``), without a thread per waiting coroutine.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import threading
import time
import weakref
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from django_locks.abort import AbortSignal
from django_locks.stores.base import LockStore

logger = logging.getLogger("django_locks")

T = TypeVar("T")
V = TypeVar("V")

CALL_THREADS = 32
"""Threads running the store calls of coroutines, process-wide (a pool of their own: the event
loop's default executor stays the application's)."""

WATCH_THREADS = 16
"""Keys whose release notices coroutines can wait for at once, process-wide: one thread each.
Beyond that many keys, waiters of the others sleep through their backoff until a thread frees."""

HAND_OVER_WAIT = 0.01
"""Seconds a notice thread waits at most for the event loop to resume the waiter it handed a
lock, before it waits for notices again (a busy loop may take longer: it goes on then)."""


class _Slot(Generic[V]):
    """A value made in a thread for a coroutine of ``loop``, handed over exactly once: to the
    coroutine on its loop, or, when the coroutine stopped waiting first (or its loop is gone),
    to ``undo`` (a lock nobody will see is released). One callback on the loop per handover:
    every loop iteration saved is a wake-up saved."""

    __slots__ = (
        "_abandoned",
        "_mutex",
        "_outcome",
        "done",
        "error",
        "finished",
        "future",
        "loop",
        "undo",
    )

    def __init__(self, loop: asyncio.AbstractEventLoop, undo: Callable[[V], None] | None) -> None:
        self.loop = loop
        self.undo = undo
        self.future: asyncio.Future[V] = loop.create_future()
        self.finished: asyncio.Future[None] | None = None  # awaited after a cancellation
        self.done = False  # the value reached the loop
        self.error: BaseException | None = None  # the call's error, once it reached the loop
        self._mutex = threading.Lock()
        self._outcome: tuple[V | None, BaseException | None] | None = None
        self._abandoned = False

    def put(self, value: V | None, error: BaseException | None) -> None:
        """From the thread that made it."""
        with self._mutex:
            abandoned = self._abandoned
            if not abandoned:
                self._outcome = (value, error)
        if abandoned:
            self._give_back(value)
            return
        try:
            self.loop.call_soon_threadsafe(self._settle)
        except RuntimeError:  # the loop is closed: nobody will take it
            self.abandon()

    def _settle(self) -> None:
        with self._mutex:
            outcome, self._outcome = self._outcome, None
        self.done = True
        if self.finished is not None and not self.finished.done():
            self.finished.set_result(None)
        if outcome is None:
            return  # abandoned meanwhile: given back already
        value, error = outcome
        self.error = error
        if self.future.done():  # cancelled, or resolved otherwise (a waiter's time was up)
            self._give_back(value)
        elif error is not None:
            self.future.set_exception(error)
        else:
            self.future.set_result(value)  # type: ignore[arg-type]

    def abandon(self) -> None:
        """The coroutine stops waiting (it is cancelled): from now on the value is given back.
        A value already on the future (resolved, the coroutine not resumed yet) is too."""
        with self._mutex:
            self._abandoned = True
            outcome, self._outcome = self._outcome, None
        if outcome is not None:
            self._give_back(outcome[0])
        future = self.future
        if future.done() and not future.cancelled() and future.exception() is None:
            self._give_back(future.result())

    def _give_back(self, value: V | None) -> None:
        if self.undo is not None and value is not None:
            try:
                self.undo(value)
            except Exception:
                logger.exception("Giving back %r, which nobody awaits any more, failed", value)


def _run_in_thread(slot: _Slot[V], call: Callable[[], V]) -> None:
    def run() -> None:
        try:
            value = call()
        except BaseException as exc:
            slot.put(None, exc)
        else:
            slot.put(value, None)

    try:
        _calls_pool().submit(run)
    except RuntimeError:  # interpreter shutdown: a thread of its own
        threading.Thread(target=run, name="django_locks-async", daemon=True).start()


async def finish(call: Callable[[], T], failed: Callable[[BaseException], None]) -> T:
    """Run ``call()`` (a store call bounded by its own timeout) in a thread, to its end.

    It is submitted before the first await: a cancellation cannot stop it any more. A task
    cancelled meanwhile waits for the call's answer (its timeout bounds that wait), then
    ``CancelledError`` is raised; ``failed(error)`` is told when the call failed then, since
    the error is not raised. A second cancellation changes nothing.
    """
    slot: _Slot[T] = _Slot(asyncio.get_running_loop(), None)
    _run_in_thread(slot, call)
    try:
        return await slot.future
    except asyncio.CancelledError:
        while not slot.done:
            slot.finished = slot.loop.create_future()
            try:
                await slot.finished
            except asyncio.CancelledError:
                continue  # the task is cancelled already: it raises once the call ends
        if slot.error is not None:
            failed(slot.error)
        raise


async def attempt(call: Callable[[], T | None], undo: Callable[[T], None]) -> T | None:
    """Run ``call()`` (an acquire) in a thread; a task cancelled meanwhile raises at once, and
    ``undo(result)`` (which must not block) gives back what the call returns."""
    slot: _Slot[T | None] = _Slot(asyncio.get_running_loop(), undo)  # type: ignore[arg-type]
    _run_in_thread(slot, call)
    try:
        return await slot.future
    except asyncio.CancelledError:
        slot.abandon()
        raise


_NO_NOTICE = (False, None)


class _Waiter(Generic[T]):
    """One coroutine waiting for a release notice of a key."""

    __slots__ = ("attempt", "claimed", "slot", "taken")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        attempt: Callable[[], T | None],
        undo: Callable[[T], None],
    ) -> None:
        def give_back(value: tuple[bool, T | None]) -> None:
            if value[1] is not None:
                undo(value[1])

        self.slot: _Slot[tuple[bool, T | None]] = _Slot(loop, give_back)
        self.attempt = attempt
        self.claimed = False  # a notice came and its attempt is being made for this waiter
        self.taken: threading.Event | None = None  # set once the waiter has resumed


class ReleaseNotices(Generic[T]):
    """The coroutines of one service waiting for releases, woken by its store's notices.

    One thread per awaited key, whatever the number of coroutines waiting on it, waits for the
    key's notices (``store.wait_for_release`` in slices of ``slice_`` seconds, while anybody
    waits, so a thread outlives its last waiter by one slice at most). On a notice it makes the
    acquire attempt for the first waiter (in a thread, where store calls run anyway: the attempt
    goes out as soon as a threaded waiter's would) and hands the waiter the result on its event
    loop; a waiter cancelled meanwhile has the lock it was given released. The threads come
    from a pool of ``WATCH_THREADS`` shared by the process.
    """

    def __init__(self, store: LockStore, slice_: float) -> None:
        self.store = store
        self.slice = slice_
        self.supported = True  # until the store says it sends no notices
        self._mutex = threading.Lock()
        self._rooms: dict[str, collections.deque[_Waiter[T]]] = {}
        _NOTICES.add(self)

    def forget_in_child(self) -> None:
        """After fork(), in the child: no waiting room is left whose watching thread stayed in
        the parent (its waiters would never be woken), and the mutex is made afresh."""
        self._mutex = threading.Lock()
        self._rooms = {}

    async def wait(
        self,
        key: str,
        seconds: float,
        signal: AbortSignal | None,
        attempt: Callable[[], T | None],
        undo: Callable[[T], None],
    ) -> tuple[bool, T | None]:
        """Wait up to ``seconds`` for a release notice of ``key``, less when ``signal`` aborts.

        Returns ``(True, attempt())`` when a notice came (``attempt()`` made in a thread: its
        error is raised here), ``(False, None)`` when none did. ``undo(result)`` must not
        block: it gives back a result nobody awaits any more.
        """
        loop = asyncio.get_running_loop()
        waiter = _Waiter(loop, attempt, undo)
        with self._mutex:
            room = self._rooms.get(key)
            watch = room is None
            if room is None:
                room = self._rooms[key] = collections.deque()
            room.append(waiter)
        if watch:
            try:
                _watch_pool().submit(self._watch, key)
            except RuntimeError:  # interpreter shutdown: no new threads, the backoff only
                with self._mutex:
                    self._rooms.pop(key, None)
        timer = loop.call_later(max(seconds, 0), self._expire, key, waiter)
        wake: Callable[[AbortSignal], None] | None = None
        if signal is not None:

            def wake(_: AbortSignal) -> None:
                loop.call_soon_threadsafe(self._expire, key, waiter)

            signal.add_callback(wake)
        try:
            return await waiter.slot.future
        except BaseException:
            waiter.slot.abandon()  # a lock already made for it is released
            raise
        finally:
            if waiter.taken is not None:
                waiter.taken.set()
            timer.cancel()
            if signal is not None and wake is not None:
                signal.remove_callback(wake)
            self._leave(key, waiter)

    def _expire(self, key: str, waiter: _Waiter[T]) -> None:
        """On the event loop: the waiter's time is up (or its signal aborted)."""
        with self._mutex:
            if waiter.claimed:
                return  # a notice came: the attempt's result is on its way
            self._leave_locked(key, waiter)
        if not waiter.slot.future.done():
            waiter.slot.future.set_result(_NO_NOTICE)

    def _leave(self, key: str, waiter: _Waiter[T]) -> None:
        with self._mutex:
            self._leave_locked(key, waiter)

    def _leave_locked(self, key: str, waiter: _Waiter[T]) -> None:
        room = self._rooms.get(key)
        if room is not None and not waiter.claimed:
            with contextlib.suppress(ValueError):
                room.remove(waiter)

    def _watch(self, key: str) -> None:
        """In a pool thread: wait for notices of ``key`` while anybody waits for one."""
        while True:
            with self._mutex:
                room = self._rooms[key]
                while room and room[0].slot.future.done():
                    room.popleft()  # cancelled, not gone yet
                if not room:
                    del self._rooms[key]
                    return
            try:
                woken = self.store.wait_for_release(key, self.slice)
            except NotImplementedError:
                self.supported = False
                with self._mutex:
                    del self._rooms[key]  # its waiters sleep through their backoff
                return
            except Exception as exc:
                # The notice channel is down: waiters sleep through their backoff meanwhile.
                logger.debug("Waiting for a release notice of %r failed: %s", key, exc)
                time.sleep(self.slice)
                continue
            if not woken:
                continue
            with self._mutex:
                waiter = None
                while room and waiter is None:
                    candidate = room.popleft()
                    if not candidate.slot.future.done():
                        waiter = candidate
                        waiter.claimed = True
                        waiter.taken = threading.Event()
            if waiter is not None:
                self._attempt_for(waiter)

    def _attempt_for(self, waiter: _Waiter[T]) -> None:
        try:
            result = waiter.attempt()
        except Exception as exc:
            waiter.slot.put(None, exc)
        else:
            waiter.slot.put((True, result), None)
        # Until the waiter has resumed, this thread keeps off the interpreter lock: the
        # handoff's last step is the event loop's. The key is the waiter's now, so no release
        # of it comes meanwhile (unless it lapses, which sends no notice anyway).
        assert waiter.taken is not None
        waiter.taken.wait(HAND_OVER_WAIT)


_pool_mutex = threading.Lock()
_watch_instance: ThreadPoolExecutor | None = None
_calls_instance: ThreadPoolExecutor | None = None


def _calls_pool() -> ThreadPoolExecutor:
    global _calls_instance
    if _calls_instance is None:
        with _pool_mutex:
            if _calls_instance is None:
                _calls_instance = ThreadPoolExecutor(
                    max_workers=CALL_THREADS, thread_name_prefix="django_locks-async"
                )
    return _calls_instance


def _watch_pool() -> ThreadPoolExecutor:
    global _watch_instance
    if _watch_instance is None:
        with _pool_mutex:
            if _watch_instance is None:
                _watch_instance = ThreadPoolExecutor(
                    max_workers=WATCH_THREADS, thread_name_prefix="django_locks-notices-await"
                )
    return _watch_instance


_NOTICES: weakref.WeakSet[ReleaseNotices[Any]] = weakref.WeakSet()


def forget_pools_in_child() -> None:
    """After fork(), in the child (``django_locks.process.AFTER_FORK``)."""
    # The parent's threads do not exist in a child: fresh pools on first use.
    global _watch_instance, _calls_instance, _pool_mutex
    _watch_instance = _calls_instance = None
    _pool_mutex = threading.Lock()
    for notices in list(_NOTICES):
        notices.forget_in_child()
