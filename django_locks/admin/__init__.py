"""The admin's "Leases" page: ``LeaseAdmin``, registered for ``Lease`` on the default site.

``leases.py`` holds the ``ModelAdmin`` (Django's changelist on the database store),
``listing.py`` the page of the other stores (their ``leases()``), ``states.py`` how a lease
stands or ended (in SQL and from ``LeaseInfo``), ``permits.py`` the held slots of a key taken
with permits counted in SQL, ``rows.py`` a lease as the page shows it and its cells,
``release.py`` the release action.
"""

from __future__ import annotations

from django_locks.admin.leases import LeaseAdmin

__all__ = ["LeaseAdmin"]
