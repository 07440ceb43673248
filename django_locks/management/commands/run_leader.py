"""``manage.py run_leader KEY [KEY ...]``: campaign for leaderships and run their work."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_locks import leader
from django_locks.durations import ttl_ms, wait_ms
from django_locks.service import locks

DEFAULT_GRACE = "8s"
"""Below Docker's 10 s stop timeout, so the lease is handed back before the SIGKILL."""


class Command(BaseCommand):
    help = (
        "Campaign for the leadership of each KEY (registered with @leader_election in an app's "
        "leaders module) and run its work while leading. Run it on every replica: one leads, "
        "the others take over. SIGTERM/SIGINT hand the leadership back and exit."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("keys", nargs="*", metavar="KEY", help="Election keys to campaign for.")
        parser.add_argument("--list", action="store_true", help="List the registered elections.")
        parser.add_argument("--ttl", help="Lease ttl (default: the election's, else LOCKS TTL).")
        parser.add_argument(
            "--grace",
            default=DEFAULT_GRACE,
            help=f"How long the work may take to return once stopped (default {DEFAULT_GRACE}).",
        )

    def handle(self, *args: str, **options: Any) -> None:
        keys: list[str] = options["keys"]
        elections = leader.discover()
        if options["list"]:
            if not elections:
                self.stderr.write(
                    "No @leader_election is registered (elections are found in the 'leaders' "
                    "module of each installed app)."
                )
            for key, election in elections.items():
                ttl = f"{election.ttl_ms / 1000:g}s" if election.ttl_ms else "default ttl"
                self.stdout.write(f"{key}\t{election.name}\t{ttl}")
            return
        # Usage errors exit 2, as argparse's own do (docs/ref/commands.rst).
        if not keys:
            raise CommandError(
                "Name at least one KEY to campaign for (--list shows them).", returncode=2
            )
        unknown = [key for key in keys if key not in elections]
        if unknown:
            raise CommandError(
                f"No @leader_election registered for {', '.join(map(repr, unknown))}; "
                f"registered: {', '.join(map(repr, elections)) or 'none'} (elections are found "
                "in the 'leaders' module of each installed app).",
                returncode=2,
            )
        try:
            lease_ttl = ttl_ms(options["ttl"], name="--ttl") if options["ttl"] is not None else None
            grace = wait_ms(options["grace"], name="--grace") / 1000
        except (TypeError, ValueError) as exc:
            raise CommandError(str(exc)) from exc

        stopping = threading.Event()

        def stop(signum: int, frame: Any) -> None:
            self.stderr.write(f"{signal.Signals(signum).name} received: stepping down")
            stopping.set()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.stdout.write(f"Campaigning for {', '.join(keys)}")
        code = leader.run(
            keys,
            locks=locks,
            ttl_ms=lease_ttl,
            grace=grace,
            stopping=stopping,
            report=self._report,
        )
        self.stdout.flush()
        if code:
            sys.exit(code)

    def _report(self, line: str, level: int) -> None:
        """Print a campaign's line, unless LOGGING shows it already: each line is also logged on
        the django_locks logger, and a project whose LOGGING sends that logger (at this level)
        somewhere would see it twice."""
        logger = logging.getLogger("django_locks")
        if not logger.isEnabledFor(level):
            self.stdout.write(line)
            return
        # With no handler anywhere, Python's last resort prints warnings (on stderr) itself.
        last_resort = logging.lastResort
        shown = logger.hasHandlers() or (last_resort is not None and level >= last_resort.level)
        if not shown:
            self.stdout.write(line)
