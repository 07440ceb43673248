"""A startup with ``LOCKS["BACKEND"]`` naming EtcdStore and etcd3gw not installed.

``python -m tests.children.etcd_missing_client BACKEND`` prints ``started``, or the exception's
class name and message.
"""

from __future__ import annotations

import sys

from tests.children import startup


def main(backend: str) -> None:
    sys.modules["etcd3gw"] = None  # type: ignore[assignment]  # as if not installed
    from django.conf import settings

    settings.configure(INSTALLED_APPS=["django_locks"], LOCKS={"BACKEND": backend})
    startup.report()


if __name__ == "__main__":
    main(sys.argv[1])
