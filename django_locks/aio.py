"""How coroutines reach the store: calls finished whatever the cancellation, and release notices.

Store calls never run on the event loop. A release is submitted to a thread before its first
await, so a cancellation cannot un-start it (``finish``). Async waiters are woken by the store's
release notices as threads are (``ReleaseNotices``), without a thread per waiting coroutine.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Generic, TypeVar

from django_locks.abort import AbortSignal
from django_locks.stores.base import LockStore

logger = logging.getLogger("django_locks")

T = TypeVar("T")

WATCH_THREADS = 16
"""Keys whose release notices coroutines can wait for at once, process-wide: one thread each.
Beyond that many keys, waiters of the others sleep through their backoff until a thread frees."""


async def finish(call: Callable[[], T], failed: Callable[[BaseException], None]) -> T:
    """Run ``call()`` (a store call bounded by its own timeout) in a thread, to its end.

    It is submitted before the first await: a cancellation cannot stop it any more. A task
    cancelled meanwhile waits for the call's answer (its timeout bounds that wait), then
    ``CancelledError`` is raised; ``failed(error)`` is told when the call failed then, since
    the error is not raised. A second cancellation changes nothing.
    """
    loop = asyncio.get_running_loop()
    future = _submit(loop, call)
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        await _until_done(future)
        if not future.cancelled() and future.exception() is not None:
            failed(future.exception())  # type: ignore[arg-type]
        raise


async def _until_done(future: asyncio.Future[Any]) -> None:
    while not future.done():
        try:
            await asyncio.wait([future])  # never cancels the future itself
        except asyncio.CancelledError:
            continue  # the task is cancelled already: it raises once the call ends


def _submit(loop: asyncio.AbstractEventLoop, call: Callable[[], T]) -> asyncio.Future[T]:
    try:
        return loop.run_in_executor(None, call)
    except RuntimeError:
        # The loop's default executor is shut down (the loop is closing): a thread of its own.
        done: Future[T] = Future()

        def run() -> None:
            try:
                done.set_result(call())
            except BaseException as exc:
                done.set_exception(exc)

        threading.Thread(target=run, name="django_locks-release", daemon=True).start()
        return asyncio.wrap_future(done, loop=loop)


class _Waiter(Generic[T]):
    """One coroutine waiting for a release notice of a key."""

    __slots__ = ("attempt", "claimed", "future", "loop", "undo")

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        attempt: Callable[[], T | None],
        undo: Callable[[T], None],
    ) -> None:
        self.loop = loop
        self.future: asyncio.Future[tuple[bool, T | None]] = loop.create_future()
        self.attempt = attempt
        self.undo = undo
        self.claimed = False  # a notice came and its attempt is being made for this waiter


class ReleaseNotices(Generic[T]):
    """The coroutines of one service waiting for releases, woken by its store's notices.

    One thread per awaited key, whatever the number of coroutines waiting on it, waits for the
    key's notices (``store.wait_for_release`` in slices of ``slice_`` seconds, while anybody
    waits, so a thread outlives its last waiter by one slice at most). On a notice it makes the
    acquire attempt for the first waiter (it is in a thread, where store calls run anyway, and
    the attempt goes out as soon as the threaded waiter's would) and hands the waiter the
    result on its event loop. A waiter cancelled meanwhile has what it was handed undone.
    The threads come from a pool of ``WATCH_THREADS`` shared by the process.
    """

    def __init__(self, store: LockStore, slice_: float) -> None:
        self.store = store
        self.slice = slice_
        self.supported = True  # until the store says it sends no notices
        self._mutex = threading.Lock()
        self._rooms: dict[str, collections.deque[_Waiter[T]]] = {}

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
        block: it is called on the event loop for a result nobody awaits any more.
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
                _pool().submit(self._watch, key)
            except RuntimeError:  # interpreter shutdown: no new threads, the backoff only
                with self._mutex:
                    del self._rooms[key]
        timer = loop.call_later(max(seconds, 0), self._expire, key, waiter)
        wake: Callable[[AbortSignal], None] | None = None
        if signal is not None:

            def wake(_: AbortSignal) -> None:
                loop.call_soon_threadsafe(self._expire, key, waiter)

            signal.add_callback(wake)
        try:
            return await waiter.future
        except BaseException:
            # Cancelled just after the result was handed over: give it back.
            future = waiter.future
            if future.done() and not future.cancelled() and future.exception() is None:
                result = future.result()[1]
                if result is not None:
                    undo(result)
            raise
        finally:
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
        if not waiter.future.done():
            waiter.future.set_result((False, None))

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
                while room and room[0].future.done():
                    room.popleft()  # cancelled, not yet gone
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
                    if not candidate.future.done():
                        waiter = candidate
                        waiter.claimed = True
            if waiter is not None:
                self._attempt_for(waiter)

    def _attempt_for(self, waiter: _Waiter[T]) -> None:
        result: T | None = None
        error: BaseException | None = None
        try:
            result = waiter.attempt()
        except Exception as exc:
            error = exc

        def hand_over() -> None:
            future = waiter.future
            if future.done():  # cancelled while the attempt was out
                if result is not None:
                    waiter.undo(result)
            elif error is not None:
                future.set_exception(error)
            else:
                future.set_result((True, result))

        try:
            waiter.loop.call_soon_threadsafe(hand_over)
        except RuntimeError:  # its event loop is closed: nobody awaits the result
            if result is not None:
                waiter.undo(result)


_pool_mutex = threading.Lock()
_pool_instance: ThreadPoolExecutor | None = None


def _pool() -> ThreadPoolExecutor:
    global _pool_instance
    if _pool_instance is None:
        with _pool_mutex:
            if _pool_instance is None:
                _pool_instance = ThreadPoolExecutor(
                    max_workers=WATCH_THREADS, thread_name_prefix="django_locks-notices-await"
                )
    return _pool_instance


def _forget_pool_in_child() -> None:
    # The parent's threads do not exist in a child: a fresh pool on first use.
    global _pool_instance, _pool_mutex
    _pool_instance = None
    _pool_mutex = threading.Lock()


os.register_at_fork(after_in_child=_forget_pool_in_child)
