"""The SQL functions behind ``DatabaseStore.acquire`` and ``release`` on PostgreSQL.

PL/pgSQL plans a function's statements once per session, so each call costs the server a short
``SELECT`` instead of parsing and planning the whole statement (see
``stores/database/postgresql_sql.py``). Other vendors get nothing. The function bodies come from the
store's own statements: a change to them comes with a migration that runs ``PG_FUNCTIONS``
(``CREATE OR REPLACE``) again.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

from django_locks.stores.database.postgresql_sql import PG_DROP_FUNCTIONS, PG_FUNCTIONS


def create_functions(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_FUNCTIONS, None)


def drop_functions(apps: Any, schema_editor: Any) -> None:
    if schema_editor.connection.vendor == "postgresql":
        schema_editor.execute(PG_DROP_FUNCTIONS, None)


class Migration(migrations.Migration):
    dependencies = [("django_locks", "0001_initial")]

    operations = [migrations.RunPython(create_functions, drop_functions, elidable=False)]
