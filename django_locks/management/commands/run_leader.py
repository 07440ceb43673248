"""``manage.py run_leader KEY [KEY ...]``: campaign for leaderships and run their work;
``manage.py run_leader --exec KEY -- COMMAND [ARGS ...]``: run COMMAND only while leading KEY."""

from __future__ import annotations

import logging
import signal
import sys
import threading
from typing import Any

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_locks import leader
from django_locks.durations import ttl_ms, wait_ms
from django_locks.management.exec_options import ExecOptions, exec_options, split_command
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
            help=(
                f"How long the work may take to return once stopped (default {DEFAULT_GRACE}; "
                "with --exec: COMMAND's time between SIGTERM and SIGKILL, at most ttl/3, "
                "default min(8s, ttl/3))."
            ),
        )
        parser.add_argument(
            "--exec",
            dest="exec_key",
            metavar="KEY",
            help="Lead KEY and run the COMMAND given after '--' only while leading it.",
        )
        parser.add_argument(
            "--restart-cap",
            help="With --exec: the longest wait before campaigning again after COMMAND "
            "exited (the intervals between restarts double up to it; default 60s).",
        )

    def create_parser(self, prog_name: str, subcommand: str, **kwargs: Any) -> CommandParser:
        parser = super().create_parser(prog_name, subcommand, **kwargs)
        return split_command(parser)

    def handle(self, *args: str, **options: Any) -> None:
        keys: list[str] = options["keys"]
        run_exec = exec_options(options, locks.ttl_ms)
        if run_exec is not None:
            self._exec(run_exec)
            return
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
            grace = wait_ms(options["grace"] or DEFAULT_GRACE, name="--grace") / 1000
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

    def _exec(self, run: ExecOptions) -> None:
        """``--exec``: this process's own lines go to stderr; stdout is COMMAND's."""
        from django_locks.leader_exec import ExecCampaign

        stopping = threading.Event()
        campaign = ExecCampaign(
            run.key,
            run.command,
            locks,
            ttl_ms=run.ttl_ms,
            grace=run.grace,
            restart_cap=run.restart_cap,
            stopping=stopping,
            report=lambda line, level: self._report(line, level, self.stderr),
        )

        def stop(signum: int, frame: Any) -> None:
            self.stderr.write(f"{signal.Signals(signum).name} received: stepping down")
            stopping.set()
            campaign.wake.set()

        signal.signal(signal.SIGTERM, stop)
        signal.signal(signal.SIGINT, stop)
        self.stderr.write(f"Campaigning for {run.key} to run {' '.join(run.command)}")
        code = campaign.run()
        self.stderr.flush()
        if code:
            sys.exit(code)

    def _report(self, line: str, level: int, out: Any = None) -> None:
        """Print a campaign's line, unless LOGGING shows it already: each line is also logged on
        the django_locks logger, and a project whose LOGGING sends that logger (at this level)
        somewhere would see it twice."""
        out = self.stdout if out is None else out
        logger = logging.getLogger("django_locks")
        if not logger.isEnabledFor(level):
            out.write(line)
            return
        # With no handler anywhere, Python's last resort prints warnings (on stderr) itself.
        last_resort = logging.lastResort
        shown = logger.hasHandlers() or (last_resort is not None and level >= last_resort.level)
        if not shown:
            out.write(line)
