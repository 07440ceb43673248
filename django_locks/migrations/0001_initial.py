"""The Lease table, and where its fencing tokens come from."""

from __future__ import annotations

from typing import Any

from django.db import migrations, models

SEQUENCE = "django_locks_lease_fencing_token_seq"


def create_token_source(apps: Any, schema_editor: Any) -> None:
    # PostgreSQL: a sequence, CACHE 1 so that every backend draws from one shared counter (a
    # cached block per session would hand out tokens out of order). SQLite: a one-row table with
    # the highest token handed out (DatabaseStore floors new tokens with it inside BEGIN
    # IMMEDIATE). Other vendors get nothing: the database store refuses them, and a project
    # using another store (Redis on MySQL) can still migrate.
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(f"CREATE SEQUENCE IF NOT EXISTS {SEQUENCE} AS bigint CACHE 1")
    elif vendor == "sqlite":
        schema_editor.execute(
            f"CREATE TABLE IF NOT EXISTS {SEQUENCE} "
            "(id integer NOT NULL PRIMARY KEY CHECK (id = 1), value integer NOT NULL)"
        )
        schema_editor.execute(f"INSERT OR IGNORE INTO {SEQUENCE} (id, value) VALUES (1, 0)")


def drop_token_source(apps: Any, schema_editor: Any) -> None:
    vendor = schema_editor.connection.vendor
    if vendor == "postgresql":
        schema_editor.execute(f"DROP SEQUENCE IF EXISTS {SEQUENCE}")
    elif vendor == "sqlite":
        schema_editor.execute(f"DROP TABLE IF EXISTS {SEQUENCE}")


class Migration(migrations.Migration):
    initial = True

    dependencies = []

    operations = [
        migrations.CreateModel(
            name="Lease",
            fields=[
                ("key", models.CharField(max_length=500, primary_key=True, serialize=False)),
                ("owner", models.CharField(max_length=255)),
                (
                    "holder",
                    models.CharField(blank=True, help_text="host:pid of the taker", max_length=255),
                ),
                ("fencing_token", models.BigIntegerField()),
                ("acquired_at", models.DateTimeField()),
                ("expires_at", models.DateTimeField()),
                ("released_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "verbose_name": "lease",
                "verbose_name_plural": "leases",
                "db_table": "django_locks_lease",
                "ordering": ["key"],
                "permissions": [("release_lease", "Can release a lease held by anyone")],
            },
        ),
        migrations.RunPython(create_token_source, drop_token_source),
    ]
