"""A management command that never overlaps itself (tests of the decorators)."""

from __future__ import annotations

from typing import Any

from django.core.management.base import BaseCommand, CommandParser

from django_locks.context import current_lock
from django_locks.decorators import on_one_instance, without_overlapping


class Command(BaseCommand):
    help = "Record the current lock of the run."

    runs: list[tuple[str, int]] = []

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("source")

    @without_overlapping(ttl="2s")
    @on_one_instance("import:{source}", min_hold=0.001, ttl="2s")
    def handle(self, *args: Any, **options: Any) -> None:
        lock = current_lock()
        assert lock is not None
        Command.runs.append((lock.key, lock.fencing_token))
