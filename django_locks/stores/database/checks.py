"""The database store's system checks: E101, E102, W101, W104 (no I/O), and W102 / W103 (with
I/O)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from django.core import checks
from django.db import connections
from django.utils.connection import ConnectionDoesNotExist

from django_locks.exceptions import StoreError
from django_locks.stores.database.operations import (
    ADDED_COLUMNS,
    ATOMIC_MIGRATION,
    FUNCTIONS,
    FUNCTIONS_MIGRATION,
    HOLDER_COLUMNS,
    PERMITS_MIGRATION,
    PREEMPT_COLUMNS,
    PREEMPT_MIGRATION,
    SEQUENCE,
    TABLE,
    TICK_COLUMNS,
)
from django_locks.stores.database.pools import DIALECTS
from django_locks.stores.database.sqlite_atomic import transaction_mode

if TYPE_CHECKING:
    from django_locks.stores.database.store import DatabaseStore

CHECK_TIMEOUT = 2.0
"""Seconds the I/O checks (``check --database``) wait for the database at most."""


def configuration_messages(using: str) -> list[Any]:
    """E101 (unknown alias), E102 (unsupported vendor): no I/O."""
    try:
        vendor = connections[using].vendor
    except ConnectionDoesNotExist:
        return [
            checks.Error(
                f"The lock store's database alias {using!r} is not in DATABASES.",
                hint="Set LOCKS['OPTIONS']['using'] to one of: "
                f"{', '.join(map(repr, connections))}.",
                id="django_locks.E101",
            )
        ]
    if vendor not in DIALECTS:
        return [
            checks.Error(
                f"The lock store cannot use the {vendor} database {using!r}: DatabaseStore "
                "supports PostgreSQL, and SQLite on one machine.",
                hint="Point LOCKS['OPTIONS']['using'] at a PostgreSQL database, or use "
                "'django_locks.stores.RedisStore'.",
                id="django_locks.E102",
            )
        ]
    return []


def store_messages(
    store: DatabaseStore, *, databases: Iterable[str] | None, deploy: bool
) -> list[Any]:
    """``DatabaseStore.check()``: the configuration, W101, and the schema where I/O is allowed."""
    messages = configuration_messages(store.using)
    if messages:
        return messages
    vendor = connections[store.using].vendor
    from django_locks.conf import configured_debug  # conf imports the stores' base

    if vendor == "sqlite" and not configured_debug():
        messages.append(
            checks.Warning(
                f"The lock store uses the SQLite database {store.using!r}: it only shares "
                "locks between the processes of one machine.",
                hint="Use PostgreSQL (or the RedisStore) when the project runs on more than "
                "one machine; silence django_locks.W101 if it never does.",
                id="django_locks.W101",
            )
        )
    if vendor == "sqlite" and deploy:
        messages.extend(_transaction_mode_messages(store.using))
    if deploy or (databases is not None and store.using in databases):
        messages.extend(_schema_messages(store))
    return messages


def _transaction_mode_messages(using: str) -> list[Any]:
    """W104 (``check --deploy``): SQLite without ``transaction_mode`` IMMEDIATE, which
    ``lock.atomic()`` needs (it refuses to run without it)."""
    mode = transaction_mode(connections[using].settings_dict)
    if mode in ("IMMEDIATE", "EXCLUSIVE"):
        return []
    return [
        checks.Warning(
            f"The lock store's SQLite database {using!r} begins its transactions DEFERRED "
            f"(transaction_mode {mode!r}): lock.atomic() refuses to run there, and a "
            "transaction.atomic() block that writes waits for the file's write lock midway.",
            hint=f"Set DATABASES[{using!r}]['OPTIONS']['transaction_mode'] = 'IMMEDIATE' "
            "(Django 5.1+); silence django_locks.W104 if the project never uses lock.atomic().",
            id="django_locks.W104",
        )
    ]


def _schema_messages(store: DatabaseStore) -> list[Any]:
    # Only a schema that should be there and is not is worth a warning: while django_locks'
    # migrations are not applied on this alias (the first `migrate`, which runs the checks
    # before it migrates), Django's own unapplied-migrations notice covers it.
    pools = store._pools
    try:
        missing = pools.run(pools.ops.missing_schema, (), CHECK_TIMEOUT, renewal=False, write=False)
    except StoreError as exc:
        return [
            checks.Warning(
                f"The lock store could not reach the database {store.using!r}: {exc}",
                hint="Check that the database is up and reachable from here.",
                id="django_locks.W103",
            )
        ]
    if not missing:
        return []
    what, plural = missing_text(missing)
    return [
        checks.Warning(
            f"The lock store's {what} {'are' if plural else 'is'} missing from the database "
            f"{store.using!r}, although its migrations are recorded as applied (a restored "
            "dump, a dropped table).",
            hint=repair_hint(missing, store.using, pools.ops.recreate_sequence),
            id="django_locks.W102",
        )
    ]


def _functions(missing: list[str], migration: str) -> list[str]:
    names = {signature.partition("(")[0] for signature in FUNCTIONS[migration]}
    return [name for name in missing if name in names]


def missing_text(missing: list[str]) -> tuple[str, bool]:
    """What ``missing_schema()`` found missing, in words, and whether that is plural."""
    parts = [name for name in (TABLE, SEQUENCE) if name in missing]
    columns = [name for name in missing if name in ADDED_COLUMNS]
    if columns:
        parts.append(f"column{'s' * (len(columns) > 1)} {', '.join(columns)} of {TABLE}")
    functions = [name for migration in FUNCTIONS for name in _functions(missing, migration)]
    if functions:
        parts.append(f"SQL functions {', '.join(functions)}")
    plural = len(parts) > 1 or len(columns) > 1 or bool(functions)
    return " and ".join(parts), plural


def repair_hint(missing: list[str], using: str, recreate_sequence: str) -> str:
    """How to bring back what W102 found missing: a plain `migrate` answers "No migrations to
    apply", since Django's records say they ran. Each way keeps every key's fencing token growing
    (the rows, where they survive, are the floor of every new token)."""
    database = f" --database {using}"
    if TABLE in missing:
        # The table is gone, so there is nothing to keep: run every migration again (the token
        # source is created only if it is missing, the SQL functions are replaced).
        return (
            f"Run `manage.py migrate django_locks zero --fake{database}`, then "
            f"`manage.py migrate django_locks{database}`."
        )
    if SEQUENCE in missing:
        return f"In `manage.py dbshell{database}`, run `{recreate_sequence}`"
    old_functions = bool(_functions(missing, FUNCTIONS_MIGRATION))
    if any(name in HOLDER_COLUMNS for name in missing):
        # The table of a dump from before 0003: 0003 again adds its columns and functions (and
        # 0002 again replaces its own, when they are gone too).
        back = "0001" if old_functions else "0002"
        return (
            f"Run `manage.py migrate django_locks {back} --fake{database}`, then "
            f"`manage.py migrate django_locks{database}`: this adds the columns and creates the "
            "SQL functions again."
        )
    if any(name in PREEMPT_COLUMNS for name in missing):
        # The table of a dump from before 0006: 0006 again adds its column and functions (0005
        # again replaces its own, when they are gone too).
        back = "0004" if _functions(missing, PERMITS_MIGRATION) else "0005"
        return (
            f"Run `manage.py migrate django_locks {back} --fake{database}`, then "
            f"`manage.py migrate django_locks{database}`: this adds the column and creates the "
            "SQL functions again."
        )
    ticks = [name for name in missing if name in TICK_COLUMNS]
    if ticks:
        # 0007's columns (a dump from before it, or one dropped): added back as 0007 adds them,
        # in SQL, since applying 0007 again fails on a column still there. They hold nothing a
        # token depends on. Whatever else is missing is brought back after them.
        sql = " ".join(f"ALTER TABLE {TABLE} ADD COLUMN {name} bigint NULL;" for name in ticks)
        first = f"In `manage.py dbshell{database}`, run `{sql}`"
        rest = [name for name in missing if name not in TICK_COLUMNS]
        return f"{first} Then: {repair_hint(rest, using, recreate_sequence)}" if rest else first
    if len(_functions(missing, ATOMIC_MIGRATION)) == len(missing):
        # Only lock.atomic()'s guard: its table holds nothing (each row lives one transaction).
        return (
            f"Run `manage.py migrate django_locks 0007{database}`, then `manage.py migrate "
            f"django_locks{database}`: this creates lock.atomic()'s guard table, function and "
            "trigger again (nothing is lost)."
        )
    preempt = _functions(missing, PREEMPT_MIGRATION)
    if len(preempt) == len(missing):
        # Only 0006's: unapplied for real (it drops its functions and its column, which holds
        # only the current preempt requests; 0007 before it, its columns the tick records) and
        # applied again.
        return (
            f"Run `manage.py migrate django_locks 0005{database}`, then `manage.py migrate "
            f"django_locks{database}`: this creates the SQL functions again (current preempt "
            "requests and tick records are dropped, never a fencing token)."
        )
    if len(preempt) + len(_functions(missing, PERMITS_MIGRATION)) == len(missing):
        # Only 0005's (and 0006's): unapplied for real (they drop only their own functions, and
        # 0006 its column) and applied again.
        return (
            f"Run `manage.py migrate django_locks 0004{database}`, then `manage.py migrate "
            f"django_locks{database}`: this creates the SQL functions again."
        )
    # Only functions: 0003 is unapplied for real first (its columns hold nothing a token
    # depends on: the descriptions of the current leases are lost), since applying it again
    # adds columns that are there.
    steps = [f"`manage.py migrate django_locks 0002{database}`"]
    if old_functions:
        steps.append(f"`manage.py migrate django_locks 0001 --fake{database}`")
    steps.append(f"`manage.py migrate django_locks{database}`")
    return (
        f"Run {', then '.join(steps)}: this creates the SQL functions again (the holders' "
        "descriptions of current leases are dropped, never a fencing token)."
    )
