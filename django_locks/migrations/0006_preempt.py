"""Preempt requests (SPEC section 12, ``on_conflict="replace"``): a column and, on PostgreSQL, the
SQL functions answering them, under new names.

``preempt_token`` is nullable, as SPEC section 9's rolling-upgrade rule asks: a previous release's
process neither writes nor reads it and keeps working on the migrated table (its renewals renew a
lease carrying a request: such a run is not preempted). Added without rewriting the table on
PostgreSQL (a catalog change only). The functions, from the texts in
``stores/database/postgresql_preempt_sql.py``, are ``django_locks_acquire_lease`` and
``django_locks_acquire_slot`` (0005's acquires, clearing a new lease's request),
``django_locks_renew`` and ``django_locks_renew_permits`` (renewals answering whether the lease is
preempted; a batch of plain leases is one statement, as before) and ``django_locks_preempt``;
0002's, 0003's and 0005's stay, unchanged. Other vendors get the column only.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

from django_locks.stores.database.postgresql_preempt_sql import (
    PG_DROP_FUNCTIONS_V6,
    PG_FUNCTIONS_V6,
)


def create_functions(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_FUNCTIONS_V6, None)


def drop_functions(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_DROP_FUNCTIONS_V6, None)


class Migration(migrations.Migration):
    dependencies = [("django_locks", "0005_permit_functions")]

    operations = [
        migrations.AddField(
            model_name="lease",
            name="preempt_token",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.RunPython(create_functions, drop_functions, elidable=False),
    ]
