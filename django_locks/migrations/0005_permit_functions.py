"""Permits' SQL functions on PostgreSQL (SPEC sections 4 and 12), under new names.

``django_locks_acquire_plain`` (a plain acquire that refuses a slot's key and a key held by
permits), ``django_locks_acquire_permit``, ``django_locks_renew_slots``,
``django_locks_end_slot`` and ``django_locks_force_end``, from the texts in
``stores/database/postgresql_permits_sql.py``. Under SPEC section 9's rolling-upgrade rule 0002's
and 0003's functions stay, unchanged, for the processes of previous releases. Other vendors get
nothing.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

from django_locks.stores.database.postgresql_permits_sql import (
    PG_DROP_FUNCTIONS_V5,
    PG_FUNCTIONS_V5,
)


def create_functions(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_FUNCTIONS_V5, None)


def drop_functions(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_DROP_FUNCTIONS_V5, None)


class Migration(migrations.Migration):
    dependencies = [("django_locks", "0004_permits")]

    operations = [migrations.RunPython(create_functions, drop_functions, elidable=False)]
