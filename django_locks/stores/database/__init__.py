"""The database store: leases in the project's own database (PostgreSQL; SQLite on one machine).

``store.py`` holds ``DatabaseStore`` (the contract's methods); ``postgresql.py`` and
``sqlite.py`` each vendor's dialect with one method per operation, its SQL in ``*_sql.py``
(``operations.py`` their shared interface and schema names); ``pools.py`` and
``connections.py`` the store's own connections; ``listener.py`` release notices on PostgreSQL;
``checks.py`` the system checks; ``teardown.py`` letting go of a test database before Django
drops it.
"""

from __future__ import annotations

from django_locks.stores.database.store import DatabaseStore

__all__ = ["DatabaseStore"]
