"""``manage.py locks list|release|prune|health``: see, operate and probe the configured store."""

from __future__ import annotations

import argparse
import getpass
import json
import logging
import socket
import sys
from typing import Any, TextIO

from django.core.management.base import BaseCommand, CommandError, CommandParser

from django_locks.durations import MAX_DURATION_MS, bounded_ms
from django_locks.exceptions import LocksError
from django_locks.keys import validate_key
from django_locks.management import probes
from django_locks.management.probes import leases_of, none_held, table
from django_locks.service import Locks, locks
from django_locks.slots import base_of, count_held_slots
from django_locks.stores.base import LeaseInfo
from django_locks.stores.naming import describe_store

logger = logging.getLogger("django_locks")


def _accept_common_options(parser: CommandParser) -> None:
    """Django's common options after the subcommand too (``locks list --settings
    mysite.other``, as every other command takes them at its end): the same options, their
    defaults left to the command's own parser (``SUPPRESS``)."""
    same = "As before the subcommand."
    for option in ("--settings", "--pythonpath"):
        parser.add_argument(option, default=argparse.SUPPRESS, help=same)
    parser.add_argument(
        "-v", "--verbosity", type=int, choices=[0, 1, 2, 3], default=argparse.SUPPRESS, help=same
    )
    for flag in ("--traceback", "--no-color", "--force-color", "--skip-checks"):
        parser.add_argument(flag, action="store_true", default=argparse.SUPPRESS, help=same)


class Command(BaseCommand):
    help = (
        "See and operate the configured lock store's leases (those of LOCKS['KEY_PREFIX'], "
        "shown without it): `list` them, `release` one held by a process that is gone for "
        "good, `prune` long-released rows of the database store, `health`: exit 0 when the "
        "store answers and every election has a leader."
    )
    stealth_options = ("stdin",)

    def add_arguments(self, parser: CommandParser) -> None:
        commands = parser.add_subparsers(dest="subcommand", metavar="{list,release,prune,health}")
        commands.required = True
        listing = commands.add_parser("list", help="List held leases, held first then by key.")
        listing.add_argument(
            "--all", action="store_true", help="Also expired and released leases (if kept)."
        )
        listing.add_argument("--json", action="store_true", help="Print a JSON list.")
        listing.add_argument(
            "--watch",
            action="store_true",
            help="Refresh every second until Ctrl-C (--json: one JSON document a line).",
        )
        release = commands.add_parser(
            "release", help="Free KEY whoever holds it (it keeps its token)."
        )
        release.add_argument("key", metavar="KEY")
        release.add_argument("--yes", action="store_true", help="Do not ask for confirmation.")
        prune = commands.add_parser(
            "prune",
            help="Delete database-store rows released or expired more than DURATION ago.",
        )
        prune.add_argument(
            "--older-than", required=True, metavar="DURATION", help='For example "30d".'
        )
        prune.add_argument(
            "--dry-run", action="store_true", help="Count the rows it would delete; delete none."
        )
        probes.add_health_parser(commands)
        for subcommand in (listing, release, prune, commands.choices["health"]):
            _accept_common_options(subcommand)

    def handle(self, *args: Any, **options: Any) -> None:
        stdin: TextIO = options.get("stdin") or sys.stdin
        # Every store call goes through the service: the keys of its KEY_PREFIX alone.
        service: Locks = locks
        try:
            if options["subcommand"] == "list" and options["watch"]:
                probes.watch(
                    self, service, include_inactive=options["all"], as_json=options["json"]
                )
            elif options["subcommand"] == "list":
                self.list(service, include_inactive=options["all"], as_json=options["json"])
            elif options["subcommand"] == "health":
                probes.health(self, options)
            elif options["subcommand"] == "release":
                self.release(service, options["key"], confirmed=options["yes"], stdin=stdin)
            else:
                self.prune(service, options["older_than"], dry_run=options["dry_run"])
        except LocksError as exc:
            raise CommandError(
                f"The lock store {describe_store(service.store)} failed: {exc}"
            ) from exc

    def list(self, service: Locks, *, include_inactive: bool, as_json: bool) -> None:
        leases = leases_of(service, include_inactive)
        if as_json:
            self.stdout.write(json.dumps(probes.as_json_list(leases), indent=2))
            return
        if not leases:
            self.stderr.write(none_held(service, include_inactive))
            return
        for line in table(leases):
            self.stdout.write(line)

    def release(self, service: Locks, key: str, *, confirmed: bool, stdin: TextIO) -> None:
        # Before any store call: an argument that is not valid UTF-8 reaches Python as lone
        # surrogates, which no store could encode (nor one too long with the key prefix).
        try:
            validate_key(key, name="KEY")
            held = service.lease(key)
        except (TypeError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        except NotImplementedError:
            held = None  # a store that cannot list: ask, then try
        else:
            if held is None:  # say so before asking anything
                raise CommandError(f"No live lease on {key!r}: nothing to release.")
        # A key taken with permits: its own record frees every slot (say how many first).
        slots = None if held is None or not held.is_summary else count_held_slots(service, key)
        what = repr(key) + _described(held, slots)
        if not confirmed:
            whose = "Its holder is" if slots is None or slots == 1 else "Each holder is"
            self.stdout.write(
                f"Release {what}? {whose} told at its next renewal that the lock was "
                "lost; until then it may still be working. [y/N] ",
                ending="",
            )
            self.stdout.flush()
            answer = stdin.readline()
            if not answer.endswith("\n"):
                self.stdout.write("")  # no answer typed: end the question's line
            if answer.strip().lower() not in {"y", "yes"}:
                raise CommandError("Not released." if answer else "Not released (no answer).")
        operator, host = _operator(), socket.gethostname()
        if not service.force_release(key, by=f"cli {operator}@{host}"):
            raise CommandError(f"No live lease on {key!r}: nothing was released.")
        # The audit trail of an operator's release, as the admin's log entry is for the page.
        logger.warning(
            "Lease %r released by %s on %s with `manage.py locks release`%s; its holder learns "
            "it at its next renewal",
            key,
            operator,
            host,
            _audit(held, slots),
        )
        if held is not None and held.is_summary:
            freed = "every permit" if slots is None else f"every permit ({_permits(slots)})"
            self.stdout.write(
                f"Released {key!r}: {freed} of the key freed, fencing token "
                f"{held.fencing_token}; the key keeps its fencing token."
            )
            return
        self.stdout.write(f"Released {what}; the key keeps its fencing token.")

    def prune(self, service: Locks, older_than: str, *, dry_run: bool = False) -> None:
        try:
            ms = bounded_ms(
                older_than, name="--older-than", minimum_ms=0, maximum_ms=MAX_DURATION_MS
            )
        except (TypeError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        store = service.store
        if not store.keeps_ended_leases:
            self.stdout.write(
                f"Nothing to prune in {describe_store(store)}: only the database store keeps "
                "the rows of released and expired leases."
            )
            return
        try:
            count = service.prune(ms, dry_run=dry_run)
        except NotImplementedError as exc:
            why = f" ({exc})" if service.key_prefix else ""
            raise CommandError(
                f"The lock store {describe_store(store)} cannot prune its leases{why}."
            ) from None
        where = describe_store(store) + probes.of_prefix(service)
        if dry_run:
            self.stdout.write(
                f"Would prune {count} lease{'' if count == 1 else 's'} released or expired more "
                f"than {older_than} ago from {where} (--dry-run: nothing deleted)."
            )
            return
        self.stdout.write(
            f"Pruned {count} lease{'' if count == 1 else 's'} released or expired more than "
            f"{older_than} ago from {where}; every key's next token stays greater."
        )


def _described(held: LeaseInfo | None, slots: int | None) -> str:
    """What ``release`` says of the lease it frees: its holder, or a key's permits."""
    if held is None:
        return ""
    token = f"fencing token {held.fencing_token}"
    if held.is_summary:
        counted = "" if slots is None else f", {slots} held"
        return f" ({held.permits} permits{counted}: every permit of the key; {token})"
    permit = ""
    if held.permit is not None:
        permit = f"permit {held.permit}/{held.permits} of {base_of(held)!r}, "
    return f" ({permit}held by {held.described.describe()}, {token})"


def _audit(held: LeaseInfo | None, slots: int | None) -> str:
    """The audit line's account of what was held."""
    if held is None:
        return ""
    if held.is_summary:
        counted = "" if slots is None else f", {_permits(slots)} held"
        return (
            f" (every permit of the key: {held.permits} permits{counted}, fencing token "
            f"{held.fencing_token})"
        )
    permit = "" if held.permit is None else f"permit {held.permit}/{held.permits}, "
    return f" ({permit}it was held by {held.described}, fencing token {held.fencing_token})"


def _permits(count: int) -> str:
    return f"{count} permit{'' if count == 1 else 's'}"


def _operator() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment (a container without /etc/passwd)
        return "an unknown user"
