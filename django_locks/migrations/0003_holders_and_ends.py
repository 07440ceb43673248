"""Who holds each lease, its last renewal, how it ended; the new SQL functions.

Under SPEC section 9's rolling-upgrade rule: every new column is nullable (a 0.1.0 process, which
writes none of them, keeps working on the migrated table), and the new behaviour is in SQL
functions with new names (``django_locks_acquire_as``, ...); 0002's functions stay, unchanged,
for the processes of the previous release. On PostgreSQL the nullable columns are added without
rewriting the table (catalog changes only), so the table's lock, which lasts until the migration
commits, holds lock calls back for milliseconds whatever the number of rows (0.012 s at 100,000
rows, 0.011 s at a million, measured once on PostgreSQL 15). No index is added:
see ``models.Lease``.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

from django_locks.stores.database.postgresql_sql import PG_DROP_FUNCTIONS_V3, PG_FUNCTIONS_V3


def create_functions(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_FUNCTIONS_V3, None)


def drop_functions(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_DROP_FUNCTIONS_V3, None)


class Migration(migrations.Migration):
    dependencies = [
        ("django_locks", "0002_sql_functions"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="lease",
            options={
                "default_permissions": ("view",),
                "ordering": ["key"],
                "permissions": [("release_lease", "Can release a lease held by anyone")],
                "verbose_name": "lease",
                "verbose_name_plural": "leases",
            },
        ),
        migrations.AddField(
            model_name="lease",
            name="described_token",
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="lease",
            name="end_reason",
            field=models.CharField(
                blank=True,
                help_text="How the lease ended, or for a lease left to lapse, how it will end",
                max_length=16,
                null=True,
            ),
        ),
        migrations.AddField(
            model_name="lease",
            name="ended_by",
            field=models.CharField(blank=True, max_length=255, null=True),
        ),
        migrations.AddField(
            model_name="lease",
            name="holder_detail",
            field=models.CharField(blank=True, max_length=500, null=True),
        ),
        migrations.AddField(
            model_name="lease",
            name="holder_kind",
            field=models.CharField(blank=True, max_length=16, null=True),
        ),
        migrations.AddField(
            model_name="lease",
            name="renewed_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.RunPython(create_functions, drop_functions, elidable=False),
    ]
