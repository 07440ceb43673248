"""The event stream: what happens to locks in this process, told to the signals, the logs and
the metrics exporters (SPEC section 11).

Every acquire, release, renewal round, loss, skipped run and leadership change is one
:class:`Event`, given to each consumer in turn on the thread where it happened. The Django
signals and their log lines are the first consumer (``django_locks.signals.consume``); the
exporters of ``LOCKS["METRICS"]`` subscribe next (``django_locks.exporters``). A consumer must be
quick and must not block: it runs on the acquiring thread, and ``renewed`` events on the renewal
thread. One that raises is logged (at most once a minute each) and never breaks the lock call.

Labels are bounded: an event's ``label`` is the decorator's key template, else the ``label=``
given to the API, else the key up to its first ``:`` or ``{`` (:func:`label_of`), never the
rendered key, so 10,000 keys of one template are one label value.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING, Literal

from django_locks import signals

if TYPE_CHECKING:
    from django_locks.holders import Holder
    from django_locks.lock import Lock
    from django_locks.stores.base import LockStore

logger = logging.getLogger("django_locks")

EventKind = Literal[
    "acquired",
    "not_acquired",
    "released",
    "lost",
    "renewed",
    "run_skipped",
    "leadership_acquired",
    "leadership_lost",
]
Use = Literal["acquire", "lock", "run", "owner", "leader"]
"""What a lock was taken for: ``acquire()`` (``"acquire"``), ``lock()`` / ``with_lock()``
(``"lock"``), a decorated job's run lock (``"run"``), an owner lease (``"owner"``), a leadership
(``"leader"``). Exporters make spans for ``"lock"`` and ``"run"`` only: the others last days."""

MAX_LABEL = 100
"""The longest ``label=`` accepted (a label names a kind of lock, not one lock)."""


@dataclasses.dataclass(slots=True, eq=False)
class Event:
    """One thing that happened to a lock in this process.

    ``kind``: what happened. ``key``: the rendered key, for the signals and the logs (never a
    metric label). ``label``: the bounded label (empty for ``renewed``, a round of many keys).
    ``store``: the store, named for people (``PostgreSQL "default"``). ``use``: what the lock was
    taken for (:data:`Use`). ``outcome``, by kind: ``acquired``; ``taken``, ``aborted`` or
    ``error`` (not acquired); how it ended (``released``, ``handed back``, ``lapsed``,
    ``abandoned``); the loss's ``detected_by``; ``renewed``, ``refused`` (one lock of the round or
    more was not ours any more) or ``error``; a skipped run's code (``elsewhere``,
    ``in_progress``, ``at_capacity``); a leadership's end (``lost``, ``released``).
    ``duration`` (seconds, on the service's clock): the acquire's wait, the hold (released,
    lost), the renewal round trip.
    ``count``: the locks of a renewal round (1 otherwise).
    """

    kind: EventKind
    key: str
    label: str
    store: str
    use: Use = "acquire"
    outcome: str = ""
    duration: float | None = None
    fencing_token: int | None = None
    count: int = 1
    lock: Lock | None = None
    holder: Holder | None = None
    name: str = ""
    """A skipped run's job name, for its log line."""
    reason: str = ""
    """A skipped run's reason, the sentence ``run_skipped`` sends."""
    level: int = logging.INFO
    permit: int | None = None
    """Which permit of ``key`` (released, lost), for a lock taken with permits."""
    """The level of the skipped run's log line."""


Consumer = Callable[[Event], None]

_consumers: tuple[Consumer, ...] = (signals.consume,)
_subscribe_mutex = threading.Lock()
_failures: dict[int, float] = {}
_FAILURE_LOG_EVERY = 60.0


def subscribe(consumer: Consumer) -> Callable[[], None]:
    """Give every event from now on to ``consumer`` too; return the call that unsubscribes it."""
    if not callable(consumer):
        raise TypeError(f"`consumer` must be callable, got {consumer!r}")
    global _consumers
    with _subscribe_mutex:
        _consumers = (*_consumers, consumer)

    def unsubscribe() -> None:
        global _consumers
        with _subscribe_mutex:
            _consumers = tuple(c for c in _consumers if c is not consumer)

    return unsubscribe


def emit(event: Event) -> None:
    """Give ``event`` to every consumer; one that raises is logged and skipped."""
    for consumer in _consumers:
        try:
            consumer(event)
        except Exception:
            _failed(consumer, event)


def _failed(consumer: Consumer, event: Event) -> None:
    now = time.monotonic()
    last = _failures.get(id(consumer))
    if last is not None and now - last < _FAILURE_LOG_EVERY:
        return
    _failures[id(consumer)] = now
    logger.exception(
        "The lock event consumer %r raised on a %s event (key %r); the lock call went on. Fix "
        "or remove the consumer (an exporter of LOCKS['METRICS']?); repeats are logged at most "
        "once a minute.",
        consumer,
        event.kind,
        event.key,
    )


def label_of(key: str) -> str:
    """The default label of ``key``: up to its first ``:`` or ``{`` (the whole key if none), at
    most :data:`MAX_LABEL` characters. A key without such a prefix is its own label: pass
    ``label=`` for those (the docs say so)."""
    end = min(len(key), MAX_LABEL)
    for separator in ":{":
        found = key.find(separator, 0, end)
        if found != -1:
            end = found
    return key[:end]


def check_label(label: object) -> str | None:
    """``label`` as given to the API: None, or a str of 1 to :data:`MAX_LABEL` characters."""
    if label is None:
        return None
    if not isinstance(label, str):
        raise TypeError(f"`label` must be a str or None, got {type(label).__name__} {label!r}")
    if not 0 < len(label) <= MAX_LABEL:
        raise ValueError(
            f"`label` must be 1 to {MAX_LABEL} characters (it names a kind of lock, such as "
            f"'report', never one key), got {len(label)}: {label[:120]!r}"
        )
    return label


_names: dict[int, tuple[weakref.ref[LockStore], str]] = {}


def store_name(store: LockStore) -> str:
    """``str(store)``, made once per store (events name their store on every call); the store
    is not kept alive by it."""
    known = _names.get(id(store))
    if known is not None and known[0]() is store:
        return known[1]
    name = str(store)
    if len(_names) > 1000:  # tests make stores by the thousand; a process, a few
        _names.clear()
    _names[id(store)] = (weakref.ref(store), name)
    return name
