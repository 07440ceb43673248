"""``manage.py locks list|release|prune``: see and operate the configured store's leases."""

from __future__ import annotations

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
from django_locks.service import locks
from django_locks.stores.base import LeaseInfo, LockStore

logger = logging.getLogger("django_locks")


class Command(BaseCommand):
    help = (
        "See and operate the configured lock store's leases: `list` them, `release` one held "
        "by a process that is gone for good, `prune` long-released rows of the database store."
    )
    stealth_options = ("stdin",)

    def add_arguments(self, parser: CommandParser) -> None:
        commands = parser.add_subparsers(dest="subcommand", metavar="{list,release,prune}")
        commands.required = True
        listing = commands.add_parser("list", help="List held leases, held first then by key.")
        listing.add_argument(
            "--all", action="store_true", help="Also expired and released leases (if kept)."
        )
        listing.add_argument("--json", action="store_true", help="Print a JSON list.")
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

    def handle(self, *args: Any, **options: Any) -> None:
        stdin: TextIO = options.get("stdin") or sys.stdin
        store = locks.store
        try:
            if options["subcommand"] == "list":
                self.list(store, include_inactive=options["all"], as_json=options["json"])
            elif options["subcommand"] == "release":
                self.release(store, options["key"], confirmed=options["yes"], stdin=stdin)
            else:
                self.prune(store, options["older_than"], dry_run=options["dry_run"])
        except LocksError as exc:
            raise CommandError(f"The lock store {store!r} failed: {exc}") from exc

    def list(self, store: LockStore, *, include_inactive: bool, as_json: bool) -> None:
        leases = _leases(store, include_inactive)
        if as_json:
            self.stdout.write(json.dumps([_as_json(lease) for lease in leases], indent=2))
            return
        if not leases:
            self.stderr.write(f"No {'' if include_inactive else 'held '}lease in {store!r}.")
            return
        rows = [("KEY", "STATE", "HOLDER", "TOKEN", "ACQUIRED AT", "EXPIRES IN")]
        rows += [
            (
                _printable(lease.key),
                lease.state,
                lease.holder or "-",
                str(lease.fencing_token),
                lease.acquired_at.isoformat(timespec="seconds") if lease.acquired_at else "-",
                _expiry(lease),
            )
            for lease in leases
        ]
        widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
        for row in rows:
            self.stdout.write(
                "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
            )
        if not leases:
            self.stderr.write(f"No {'' if include_inactive else 'held '}lease in {store!r}.")

    def release(self, store: LockStore, key: str, *, confirmed: bool, stdin: TextIO) -> None:
        # Before any store call: an argument that is not valid UTF-8 reaches Python as lone
        # surrogates, which no store could encode.
        try:
            validate_key(key, name="KEY")
        except (TypeError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        try:
            held = store.lease(key)
        except NotImplementedError:
            held = None  # a store that cannot list: ask, then try
        else:
            if held is None:  # say so before asking anything
                raise CommandError(f"No live lease on {key!r}: nothing to release.")
        what = repr(key)
        if held is not None:
            what += f" (held by {held.holder or '?'}, fencing token {held.fencing_token})"
        if not confirmed:
            self.stdout.write(
                f"Release {what}? Its holder is told at its next renewal that the lock was "
                "lost; until then it may still be working. [y/N] ",
                ending="",
            )
            self.stdout.flush()
            answer = stdin.readline()
            if answer.strip().lower() not in {"y", "yes"}:
                raise CommandError("Not released." if answer else "Not released (no answer).")
        if not store.force_release(key):
            raise CommandError(f"No live lease on {key!r}: nothing was released.")
        # The audit trail of an operator's release, as the admin's log entry is for the page.
        logger.warning(
            "Lease %r released by %s on %s with `manage.py locks release`%s; its holder learns "
            "it at its next renewal",
            key,
            _operator(),
            socket.gethostname(),
            ""
            if held is None
            else f" (it was held by {held.holder or '?'}, fencing token {held.fencing_token})",
        )
        self.stdout.write(f"Released {what}; the key keeps its fencing token.")

    def prune(self, store: LockStore, older_than: str, *, dry_run: bool = False) -> None:
        try:
            ms = bounded_ms(
                older_than, name="--older-than", minimum_ms=0, maximum_ms=MAX_DURATION_MS
            )
        except (TypeError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
        if not store.keeps_ended_leases:
            self.stdout.write(
                f"Nothing to prune in {store!r}: only the database store keeps the rows of "
                "released and expired leases."
            )
            return
        try:
            count = store.prune(ms, dry_run=dry_run)
        except NotImplementedError:
            raise CommandError(f"The lock store {store!r} cannot prune its leases.") from None
        if dry_run:
            self.stdout.write(
                f"Would prune {count} lease{'' if count == 1 else 's'} released or expired more "
                f"than {older_than} ago from {store!r} (--dry-run: nothing deleted)."
            )
            return
        self.stdout.write(
            f"Pruned {count} lease{'' if count == 1 else 's'} released or expired more than "
            f"{older_than} ago from {store!r}; every key's next token stays greater."
        )


def _leases(store: LockStore, include_inactive: bool) -> list[LeaseInfo]:
    try:
        return store.leases(include_inactive=include_inactive)
    except NotImplementedError:
        raise CommandError(f"The lock store {store!r} cannot list its leases.") from None


def _as_json(lease: LeaseInfo) -> dict[str, Any]:
    return {
        "key": lease.key,
        "state": lease.state,
        "holder": lease.holder,  # never the owner id: it is the holder's secret
        "fencing_token": lease.fencing_token,
        "acquired_at": lease.acquired_at.isoformat() if lease.acquired_at else None,
        "expires_in": lease.expires_in.total_seconds() if lease.expires_in is not None else None,
    }


def _operator() -> str:
    try:
        return getpass.getuser()
    except Exception:  # no user name in this environment (a container without /etc/passwd)
        return "an unknown user"


def _printable(key: str) -> str:
    """``key`` as it is, or its ``repr()`` when a store lists one no terminal could print."""
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        return repr(key)
    return key


def _expiry(lease: LeaseInfo) -> str:
    if lease.state == "released" or lease.expires_in is None:
        return "-"
    seconds = lease.expires_in.total_seconds()
    return f"{seconds:.1f}s" if seconds >= 0 else f"expired {-seconds:.1f}s ago"
