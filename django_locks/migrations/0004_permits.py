"""Permits (SPEC sections 4 and 12): the columns a key taken with permits and its slots record.

Nullable, as SPEC section 9's rolling-upgrade rule asks: a previous release's process writes
neither and keeps working on the migrated table. Added without rewriting the table on PostgreSQL
(catalog changes only). The SQL functions using them come in the next migration.
"""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("django_locks", "0003_holders_and_ends"),
    ]

    operations = [
        migrations.AddField(
            model_name="lease",
            name="permits",
            field=models.PositiveIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="lease",
            name="base_key",
            field=models.CharField(blank=True, max_length=500, null=True),
        ),
    ]
