"""The demo: threads contending for one lock, growing fencing tokens, and a lock lost.

Run with ``make demo``. It uses the demo project's SQLite database and the default store, so
there is nothing to install or start. Every step checks its own outcome and the demo exits
non-zero if one is not what it says.
"""

from __future__ import annotations

import os
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "testproject.settings")
os.environ.setdefault("DEMO_DATABASE", os.path.join(tempfile.mkdtemp(), "demo.sqlite3"))

import django

django.setup()

from django.core.management import call_command  # noqa: E402

from django_locks import LockNotAcquiredError, locks  # noqa: E402
from django_locks.signals import lock_lost  # noqa: E402

KEY = "invoices:nightly-export"


def say(text: str) -> None:
    print(text, flush=True)


def check(condition: bool, failure: str) -> None:
    if not condition:
        say(f"DEMO FAILED: {failure}")
        sys.exit(1)


def contend() -> None:
    say("1. Three workers start the nightly export at the same time.")
    ran: list[str] = []
    start = threading.Barrier(3)

    def worker(name: str) -> None:
        start.wait()
        try:
            with locks.lock(KEY) as lock:
                say(f"   {name}: got the lock (fencing token {lock.fencing_token}), exporting...")
                ran.append(name)
                time.sleep(0.5)
        except LockNotAcquiredError:
            say(f"   {name}: the export is already running elsewhere; skipping")

    threads = [threading.Thread(target=worker, args=(f"worker-{i}",)) for i in (1, 2, 3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    check(len(ran) == 1, f"expected one export, got {ran}")
    say("   -> exactly one export ran.\n")


def tokens_grow() -> None:
    say("2. Each new holder gets a greater fencing token, even after a release.")
    tokens = []
    for _ in range(3):
        with locks.lock(KEY) as lock:
            tokens.append(lock.fencing_token)
    say(f"   tokens: {tokens}")
    check(tokens == sorted(set(tokens)), "tokens did not grow")
    say("   -> a write carrying an older token can be refused (fenced_update).\n")


def wait_for_it() -> None:
    say("3. An admin clicks 'export now' while the export runs: it waits 2 s, then gets 409.")
    holder = locks.acquire(KEY)
    check(holder is not None, "could not take the lock")
    started = time.monotonic()
    try:
        with locks.lock(KEY, wait="2s"):
            check(False, "the second export ran")
    except LockNotAcquiredError as exc:
        say(f"   after {time.monotonic() - started:.1f}s: {exc} -> HTTP 409")
    assert holder is not None
    threading.Timer(0.3, holder.release).start()
    with locks.lock(KEY, wait="2s") as lock:
        say(f"   a waiter with wait='2s' gets it once released (token {lock.fencing_token}).\n")


def lose_it() -> None:
    say("4. A holder loses its lock (an operator force-releases it; another process takes it).")
    heard: list[dict[str, object]] = []

    def on_lost(sender: object, **kwargs: object) -> None:
        heard.append(kwargs)

    lock_lost.connect(on_lost, weak=False)
    lock = locks.acquire(KEY, ttl="1s")
    check(lock is not None, "could not take the lock")
    assert lock is not None
    say(f"   holding {KEY!r} with fencing token {lock.fencing_token}, ttl 1s (renewed every 1/3 s)")
    locks.store.force_release(KEY)
    thief = locks.store.acquire(KEY, "another-process", 30_000)
    say(f"   another process now holds it with token {thief}")
    aborted = lock.signal.wait(5)
    check(aborted, "the signal did not abort")
    say(f"   the holder's signal aborted: {lock.signal.reason}")
    deadline = time.monotonic() + 5
    while not heard and time.monotonic() < deadline:
        time.sleep(0.01)
    check(len(heard) == 1, "lock_lost was not sent")
    say(f"   lock_lost was sent: {heard[0]}")
    check(heard[0]["detected_by"] == "renewal", "expected detection by the refused renewal")
    say("   -> the work is told (lock.signal), nothing is killed, and its late writes carry an")
    say("      old token that fenced_update refuses.\n")


def main() -> None:
    call_command("migrate", verbosity=0)
    say(f"django_locks demo: store {type(locks.store).__name__}, SQLite database\n")
    contend()
    tokens_grow()
    wait_for_it()
    lose_it()
    say("Demo finished: every step did what it said.")


if __name__ == "__main__":
    main()
