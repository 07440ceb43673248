"""A management command whose new run replaces the running one (tests of on_conflict)."""

from __future__ import annotations

import os
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_locks.context import current_lock
from django_locks.decorators import without_overlapping


class Command(BaseCommand):
    help = (
        "Hold the run lock up to --hold seconds, stopping when its signal aborts (unless "
        "--stubborn); then write 'pid token how' to --out and print it."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--out", default="")
        parser.add_argument("--hold", type=float, default=0.0)
        parser.add_argument("--stubborn", action="store_true")

    # The preempt request is read within ttl/3 (2 s): an obeying run lets go well within the
    # wait; a stubborn one keeps the lease at least 2 ttl/3 (4 s) after it, past the wait.
    @without_overlapping("replacing:report", on_conflict="replace", ttl="6s", wait="3s")
    def handle(self, *args: Any, out: str = "", hold: float = 0.0, **options: Any) -> None:
        lock = current_lock()
        assert lock is not None
        if out:
            with open(out + ".started", "a", encoding="utf-8") as fh:
                fh.write(f"{os.getpid()} {lock.fencing_token}\n")
        if options.get("stubborn"):
            time.sleep(hold)
        else:
            lock.signal.wait(hold)
        how = type(lock.signal.reason).__name__ if lock.signal.aborted else "finished"
        line = f"{os.getpid()} {lock.fencing_token} {how}"
        if out:
            with open(out, "a", encoding="utf-8") as fh:
                fh.write(line + "\n")
        self.stdout.write(f"ran: {line}")
