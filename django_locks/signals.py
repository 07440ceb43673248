"""Django signals django_locks sends, each also logged on the ``django_locks`` logger.

Every signal is sent with one sender, the ``Locks`` class (whoever sends it: the service or a
subclass, ``run_leader``, the beat hook), and keyword arguments only, robustly (a
failing receiver is logged and never breaks the sender), and never on the renewal thread.

* ``lock_lost(key, fencing_token, detected_by)``: a held lock stopped being ours.
* ``leadership_acquired(key, fencing_token, lock)``, ``leadership_lost(key, fencing_token,
  reason)`` with reason ``"lost"`` or ``"released"``.
* ``run_skipped(key, reason)``: a decorated job did not run because another holds its lock.
"""

from __future__ import annotations

import logging
from typing import Any

from django.dispatch import Signal

logger = logging.getLogger("django_locks")

lock_lost = Signal()
leadership_acquired = Signal()
leadership_lost = Signal()
run_skipped = Signal()


def send(signal: Signal, sender: Any, **kwargs: Any) -> None:
    """Send ``signal`` robustly: log every receiver that raised, with its traceback."""
    for receiver, result in signal.send_robust(sender=sender, **kwargs):
        if isinstance(result, BaseException):
            logger.error(
                "django_locks signal receiver %r raised %r",
                receiver,
                result,
                exc_info=(type(result), result, result.__traceback__),
            )
