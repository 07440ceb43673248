"""Locks inherited across fork(): the child does not hold them, and their signal says so there."""

from __future__ import annotations

import os

from django_locks import Locks
from django_locks.exceptions import AbortedError
from django_locks.stores import InMemoryStore


def _child_exit_code(check: object) -> int:
    pid = os.fork()
    if pid == 0:  # the child: report through the exit status only
        try:
            os._exit(0 if check() else 1)  # type: ignore[operator]
        except BaseException:
            os._exit(2)
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


def test_an_inherited_lock_is_not_held_and_its_signal_aborts_in_the_child() -> None:
    service = Locks(InMemoryStore(), ttl="30s")
    made_before = service.acquire("inherited:signal-made")  # its signal exists before fork()
    made_after = service.acquire("inherited:signal-not-made")
    assert made_before is not None and made_after is not None
    parent_signal = made_before.signal

    def check() -> bool:
        return all(
            not lock.held
            and lock.signal.aborted
            and isinstance(lock.signal.reason, AbortedError)
            and "parent" in str(lock.signal.reason)
            for lock in (made_before, made_after)
        )

    assert _child_exit_code(check) == 0
    assert made_before.held and made_after.held
    assert not parent_signal.aborted and not made_after.signal.aborted
    assert made_before.release() and made_after.release()
