"""What ``manage.py locks`` prints of leases (the table, the JSON), its ``list --watch`` loop and
its ``health`` probe (the checks themselves are :mod:`django_locks.health`'s)."""

from __future__ import annotations

import datetime
import json
import os
import signal
import sys
import threading
import time
from typing import TYPE_CHECKING, Any

from django.core.management.base import BaseCommand, CommandError

from django_locks import health as checks
from django_locks.durations import timeout_seconds
from django_locks.exceptions import LocksError
from django_locks.slots import base_of, held_slots
from django_locks.stores.base import LeaseInfo
from django_locks.stores.naming import describe_store

if TYPE_CHECKING:
    from django_locks.service import Locks

WATCH_EVERY = 1.0
"""Seconds between two refreshes of ``locks list --watch``."""

WATCH_CALL_LIMIT = 10.0
"""Seconds one refresh waits for the store's answer (its own timeout normally answers first)."""

CLEAR = "\x1b[H\x1b[2J"
"""Cursor home, then clear the screen (ANSI; every terminal emulator in use understands it)."""


def leases_of(service: Locks, include_inactive: bool) -> list[LeaseInfo]:
    """The leases of the service's keys (its key prefix's alone, shown without it)."""
    try:
        return service.leases(include_inactive=include_inactive)
    except NotImplementedError:
        raise CommandError(
            f"The lock store {describe_store(service.store)} cannot list its leases."
        ) from None


def of_prefix(service: Locks) -> str:
    """What a line about the store adds when the service keeps to a key prefix: only the
    keys under it are listed, released or pruned."""
    if not service.key_prefix:
        return ""
    return f" (keys of LOCKS['KEY_PREFIX'] {service.key_prefix!r})"


def none_held(service: Locks, include_inactive: bool) -> str:
    where = describe_store(service.store) + of_prefix(service)
    return f"No {'' if include_inactive else 'held '}lease in {where}."


def table(leases: list[LeaseInfo]) -> list[str]:
    """The lines of ``locks list``: a header, then a row per lease, in aligned columns; a
    PERMITS column after the key where a key taken with permits is listed (``permit 2/5`` on
    a slot, ``5 permits, 3 held`` on the key's own record, which has no holder)."""
    held = held_slots(leases)
    with_permits = any(lease.permits is not None for lease in leases)
    rows: list[tuple[str, ...]]
    rows = [("KEY", "STATE", "HOLDER", "TOKEN", "ACQUIRED AT", "LAST RENEWED", "EXPIRES IN")]
    rows += [
        (
            _printable(lease.key),
            _state(lease),
            str(lease.described) if lease.holder and not lease.is_summary else "-",
            str(lease.fencing_token),
            _moment(lease.acquired_at),
            _moment(lease.last_renewed),
            _expiry(lease),
        )
        for lease in leases
    ]
    if with_permits:
        notes = ["PERMITS", *(permits_note(lease, held[lease.key]) for lease in leases)]
        rows = [(row[0], note, *row[1:]) for row, note in zip(rows, notes, strict=True)]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return [
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]


def permits_note(lease: LeaseInfo, held: int) -> str:
    """The PERMITS cell: ``permit 2/5``, ``5 permits, 3 held`` (``held``: its held slots)."""
    if lease.permit is not None:
        return f"permit {lease.permit}/{lease.permits}"
    if lease.is_summary:
        return f"{lease.permits} permits, {held} held"
    return "-"


def as_json(lease: LeaseInfo, held: int = 0) -> dict[str, Any]:
    """A lease as ``locks list --json`` prints it; ``held``: for a key's own record under
    permits (no holder: ``holder`` and ``holder_info`` are null), its held slots."""
    # Never the owner id: it is the holder's secret (SPEC section 2).
    holder = lease.described
    summary = lease.is_summary
    return {
        "key": lease.key,
        "state": lease.state,
        "ended": lease.ended,
        "ended_by": lease.ended_by,
        "holder": None if summary else lease.holder,
        "holder_info": None
        if summary
        else {
            "host": holder.host,
            "pid": holder.pid,
            "kind": holder.kind,
            "detail": holder.detail,
            "since": _iso(holder.since),
            "expires_at": _iso(holder.expires_at),
        },
        "fencing_token": lease.fencing_token,
        "acquired_at": _iso(lease.acquired_at),
        "last_renewed": _iso(lease.last_renewed),
        "expires_in": lease.expires_in.total_seconds() if lease.expires_in is not None else None,
        "permit": lease.permit,
        "permits": lease.permits,
        "base_key": base_of(lease),
        "held_permits": held if summary else None,
    }


def as_json_list(leases: list[LeaseInfo]) -> list[dict[str, Any]]:
    """Every lease as :func:`as_json`, each summary with its held slots among ``leases``."""
    held = held_slots(leases)
    return [as_json(lease, held[lease.key]) for lease in leases]


def _iso(moment: datetime.datetime | None) -> str | None:
    return moment.isoformat() if moment is not None else None


def _moment(moment: datetime.datetime | None) -> str:
    return moment.isoformat(timespec="seconds") if moment is not None else "-"


def _state(lease: LeaseInfo) -> str:
    """``held``, how the lease ended (``force released by cli bob@ops-1``), or its state when
    the store does not say (a lease a previous release's process ended)."""
    if lease.state == "held" or lease.ended is None:
        return lease.state
    if lease.ended == "force released" and lease.ended_by:
        return f"force released by {lease.ended_by}"
    return lease.ended


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


def watch(command: BaseCommand, service: Locks, *, include_inactive: bool, as_json: bool) -> None:
    """``locks list --watch``: the listing again every second until SIGINT (Ctrl-C), which ends
    it with exit status 0. On a terminal the screen is cleared between refreshes; otherwise
    (a pipe, a file, a test) each refresh is a timestamped block followed by a blank line, or
    with ``--json`` one JSON document per line. A store error is shown with its fix, and the
    next refresh tries again."""
    stop = threading.Event()
    previous = None
    if threading.current_thread() is threading.main_thread():
        previous = signal.signal(signal.SIGINT, lambda signum, frame: stop.set())
    terminal = command.stdout.isatty() and not as_json
    try:
        next_at = time.monotonic()
        while not stop.is_set():
            lines = _refresh(service, include_inactive, as_json, stop)
            if stop.is_set():
                break
            if terminal:
                command.stdout.write(CLEAR, ending="")
            for line in lines:
                command.stdout.write(line)
            if not terminal and not as_json:
                command.stdout.write("")
            command.stdout.flush()
            next_at = max(next_at + WATCH_EVERY, time.monotonic())
            stop.wait(next_at - time.monotonic())
    except KeyboardInterrupt:
        pass  # SIGINT with no handler of ours (a thread other than the main one): the same end
    except BrokenPipeError:
        # `locks list --watch | head`: the reader is gone; end quietly, as Ctrl-C does.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)


def _refresh(
    service: Locks, include_inactive: bool, in_json: bool, stop: threading.Event
) -> list[str]:
    """One refresh's lines: its header and the table (or one JSON document), or the error."""
    at = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    store = service.store
    name = describe_store(store)
    deadline = time.monotonic() + WATCH_CALL_LIMIT
    try:
        leases = checks.call(lambda: leases_of(service, include_inactive), deadline, stop)
    except (LocksError, TimeoutError) as exc:
        status, fix = checks.failure(exc, store, WATCH_CALL_LIMIT)
        if in_json:
            error = status.removeprefix("error: ")  # the key says it already
            return [json.dumps({"at": at, "store": name, "error": error, "fix": fix})]
        return [f"{at}  {name}: {status}", f"fix: {fix}", "(trying again every second)"]
    if in_json:
        document = {"at": at, "store": name, "leases": as_json_list(leases)}
        return [json.dumps(document)]
    # A key's own record under permits is no holder's lease: its slots are counted.
    held = sum(lease.state == "held" and not lease.is_summary for lease in leases)
    header = f"{at}  {name}{of_prefix(service)}: {held} held lease{'' if held == 1 else 's'}"
    if include_inactive:
        ended = sum(lease.state != "held" and not lease.is_summary for lease in leases)
        header += f", {ended} ended"
    body = table(leases) if leases else [none_held(service, include_inactive)]
    return [f"{header} (every {WATCH_EVERY:g}s, Ctrl-C to stop)", *body]


def add_health_parser(commands: Any) -> None:
    parser = commands.add_parser(
        "health",
        help="Exit 0 when the store answers and every registered election has a leader, 1 "
        "otherwise (for container probes); one line per check.",
    )
    parser.add_argument(
        "--election",
        action="append",
        default=[],
        metavar="KEY",
        help="Also expect a leader for KEY (repeatable).",
    )
    parser.add_argument(
        "--skip-registered",
        action="store_true",
        help="Do not check the elections found in code (@leader_election, celery beat's): "
        "only the store and each --election.",
    )
    parser.add_argument(
        "--timeout",
        default=f"{checks.DEFAULT_TIMEOUT:g}s",
        metavar="DURATION",
        help=f"How long all the checks may take together (default {checks.DEFAULT_TIMEOUT:g}s).",
    )
    parser.add_argument("--json", action="store_true", help="Print one JSON document.")


def health(command: BaseCommand, options: dict[str, Any]) -> None:
    """``locks health``: print each check, exit 1 when one failed."""
    # Usage errors exit 2, as argparse's own do: a probe's own mistake reads apart from a failure.
    try:
        timeout = timeout_seconds(options["timeout"], name="--timeout")
        expected = checks.elections(options["election"], registered=not options["skip_registered"])
    except (TypeError, ValueError) as exc:
        raise CommandError(str(exc), returncode=2) from exc
    results = checks.run(expected, timeout=timeout)
    failed = [result for result in results if not result.ok]
    if options["json"]:
        document = {"healthy": not failed, "checks": [result.as_json() for result in results]}
        command.stdout.write(json.dumps(document, indent=2))
    else:
        for result in results:
            command.stdout.write(str(result))
    if failed:
        unchecked = sum(result.status.startswith("not checked") for result in failed)
        said = f"{len(failed) - unchecked} of {len(results)} checks failed"
        if unchecked:
            said += f", {unchecked} not checked"
        raise CommandError(f"Unhealthy: {said}.", returncode=1)
