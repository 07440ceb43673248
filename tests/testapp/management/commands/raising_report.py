"""A management command that fails when its previous run still runs (tests of on_conflict)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_locks.context import current_lock
from django_locks.decorators import without_overlapping


class Command(BaseCommand):
    help = (
        "Under the run lock: create the file --started names, sleep --sleep seconds, then print "
        "the lock's token."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--sleep", type=float, default=0.0)
        parser.add_argument("--started", default="")

    @without_overlapping("raising:report", on_conflict="raise", ttl="2s")
    def handle(self, *args: Any, sleep: float = 0.0, started: str = "", **options: Any) -> None:
        lock = current_lock()
        assert lock is not None
        if started:
            Path(started).touch()
        if sleep:
            time.sleep(sleep)
        self.stdout.write(f"ran with token {lock.fencing_token}")
