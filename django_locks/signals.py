"""Django signals django_locks sends, each also logged on the ``django_locks`` logger.

Every signal is sent with one sender, the ``Locks`` class (whoever sends it: the service or a
subclass, ``run_leader``, the beat hook), and keyword arguments only, robustly (a
failing receiver is logged and never breaks the sender), and never on the renewal thread.

* ``lock_lost(key, fencing_token, detected_by)``: a held lock stopped being ours
  (``detected_by`` ``"renewal"``, ``"deadline"`` or ``"max_hold"``; a preempted lock is not
  lost to a failure and sends none).
* ``leadership_acquired(key, fencing_token, lock)``, ``leadership_lost(key, fencing_token,
  reason)`` with reason ``"lost"`` or ``"released"``.
* ``run_skipped(key, reason, code)``: a decorated job did not run because another holds its
  lock; ``reason`` the sentence logged, ``code`` its short name (``"elsewhere"``,
  ``"in_progress"``, ``"at_capacity"``, ``"not_replaced"``, ``"missed"``, ``"duplicate"``), the
  metrics label.

They are the first consumer of the event stream (``django_locks.events``): :func:`consume`
sends them, and logs the loss and the skipped run, from the events.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from django.dispatch import Signal

if TYPE_CHECKING:
    from django_locks.events import Event

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


def consume(event: Event) -> None:
    """The signals' and the logs' share of the event stream (every other event is none of
    theirs: acquisitions and renewals are for the exporters)."""
    kind = event.kind
    if kind not in _SIGNALLED:
        return
    from django_locks.service import Locks  # the one documented sender (SPEC section 2)

    if kind == "lost" and event.outcome == "preempted":
        # Asked for by a replacing run: nothing failed, so no lock_lost (SPEC section 12).
        logger.info(
            "Lock preempted: key=%r%s fencing_token=%s (a run with on_conflict='replace' asked "
            "for it; its signal aborted with PreemptedError)",
            event.key,
            "" if event.permit is None else f" permit={event.permit}",
            event.fencing_token,
        )
    elif kind == "lost":
        from django_locks.stores.base import holder_name

        logger.warning(
            # The holder, never the owner id: that is the holder's secret (SPEC section 2).
            "Lock lost: key=%r%s fencing_token=%s detected_by=%s holder=%s",
            event.key,
            "" if event.permit is None else f" permit={event.permit}",
            event.fencing_token,
            event.outcome,
            holder_name(),
        )
        send(
            lock_lost,
            Locks,
            key=event.key,
            fencing_token=event.fencing_token,
            detected_by=event.outcome,
        )
    elif kind == "run_skipped":
        # The rendered key, and the holder where the failed acquire's answer named it.
        held = "" if event.holder is None else f" (held by {event.holder.describe()})"
        logger.log(
            event.level, "Skipped %s (key %r): %s%s", event.name, event.key, event.reason, held
        )
        send(run_skipped, Locks, key=event.key, reason=event.reason, code=event.outcome)
    elif kind == "leadership_acquired":
        send(
            leadership_acquired,
            Locks,
            key=event.key,
            fencing_token=event.fencing_token,
            lock=event.lock,
        )
    else:
        send(
            leadership_lost,
            Locks,
            key=event.key,
            fencing_token=event.fencing_token,
            reason=event.outcome,
        )


_SIGNALLED = frozenset({"lost", "run_skipped", "leadership_acquired", "leadership_lost"})
