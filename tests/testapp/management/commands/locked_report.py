"""A management command run on one instance per cron tick (tests of the decorators)."""

from __future__ import annotations

import os
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_locks.context import current_lock
from django_locks.decorators import on_one_instance


class Command(BaseCommand):
    help = "Write one line to --out (pid and fencing token), sleeping --sleep seconds first."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--out", default="")
        parser.add_argument("--sleep", type=float, default=0.0)
        parser.add_argument("--fail", action="store_true")

    @on_one_instance(min_hold="3s", ttl="2s")
    def handle(self, *args: Any, out: str = "", sleep: float = 0.0, **options: Any) -> None:
        lock = current_lock()
        assert lock is not None
        if sleep:
            time.sleep(sleep)
        if options.get("fail"):
            raise RuntimeError("the report failed")
        if out:
            with open(out, "a", encoding="utf-8") as fh:
                fh.write(f"{os.getpid()} {lock.key} {lock.fencing_token}\n")
        self.stdout.write(f"ran with token {lock.fencing_token}")
