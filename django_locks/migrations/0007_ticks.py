"""Tick records (SPEC section 12, ``on_one_instance(catch_up=True)``): two columns of the key's
row, ``tick_ms`` and ``tick_token``.

Both are nullable, as SPEC section 9's rolling-upgrade rule asks: a previous release's process
neither writes nor reads them and keeps working on the migrated table (its acquires, renewals and
releases list the columns they write, and these are not among them). Added without rewriting the
table on PostgreSQL (a catalog change only). No SQL function is created or changed:
``record_tick`` is one ``UPDATE`` of its own (``stores/database/postgresql_sql.py``,
``sqlite_sql.py``), so every vendor gets the columns alone.
"""

from __future__ import annotations

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("django_locks", "0006_preempt")]

    operations = [
        migrations.AddField(
            model_name="lease",
            name="tick_ms",
            field=models.BigIntegerField(
                blank=True,
                null=True,
                help_text=(
                    "The scheduled time of the last tick recorded, in ms since the Unix epoch (UTC)"
                ),
            ),
        ),
        migrations.AddField(
            model_name="lease",
            name="tick_token",
            field=models.BigIntegerField(
                blank=True,
                null=True,
                help_text="The fencing token of the lease that recorded the tick",
            ),
        ),
    ]
