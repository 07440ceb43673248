"""The guard of ``lock.atomic()`` on PostgreSQL (SPEC section 13): a table, the PL/pgSQL function
that checks the lease inside COMMIT, and the deferred constraint trigger that runs it (the SQL and
its reasons: ``stores/database/atomic_sql.py``).

A new table and function only: the ``Lease`` table and the functions of earlier migrations are
unchanged, so processes of a previous release keep working beside it (SPEC section 9). The table
stays empty (each row is removed by its own trigger at COMMIT, or rolled back). Other vendors get
nothing: SQLite's check is an ``UPDATE`` of the lease row.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

from django_locks.stores.database.atomic_sql import PG_ATOMIC_DDL, PG_ATOMIC_DROP


def create_guard(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_ATOMIC_DDL, None)


def drop_guard(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_ATOMIC_DROP, None)


class Migration(migrations.Migration):
    dependencies = [("django_locks", "0007_ticks")]

    operations = [migrations.RunPython(create_guard, drop_guard, elidable=False)]
