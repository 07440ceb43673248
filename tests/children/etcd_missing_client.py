"""A startup with ``LOCKS["BACKEND"]`` naming EtcdStore and etcd3gw not installed.

``python -m tests.children.etcd_missing_client BACKEND`` prints ``started``, or the exception's
class name and message.
"""

from __future__ import annotations

import sys


def main(backend: str) -> None:
    sys.modules["etcd3gw"] = None  # type: ignore[assignment]  # as if not installed
    import django
    from django.conf import settings

    settings.configure(INSTALLED_APPS=["django_locks"], LOCKS={"BACKEND": backend})
    try:
        django.setup()
    except Exception as exc:
        print(type(exc).__name__, exc)
    else:
        print("started")


if __name__ == "__main__":
    main(sys.argv[1])
