"""The ``LOCKS`` setting: read once, merged with the defaults, validated without I/O."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string

from django_locks.clock import Clock
from django_locks.durations import max_hold_ms, min_hold_ms, ttl_ms
from django_locks.keys import MAX_KEY_LENGTH
from django_locks.stores.base import LockStore

DEFAULTS: dict[str, Any] = {
    "BACKEND": "django_locks.stores.DatabaseStore",
    "OPTIONS": {},
    "TTL": "30s",
    "MIN_HOLD": "30s",
    "ALLOW_IN_MEMORY_STORAGE": False,
    "CELERY_BEAT_LEADER": False,
    "CLOCK": None,
    "KEY_PREFIX": "",
    "MAX_HOLD": None,
    "METRICS": [],
}

EXPORTERS = ("opentelemetry", "prometheus")
"""The exporters ``LOCKS["METRICS"]`` may name (``django_locks.exporters`` turns them on)."""

MAX_KEY_PREFIX_LENGTH = 400
"""The longest ``LOCKS["KEY_PREFIX"]``, in characters: it counts towards the 500 characters of
every key (with the derived suffixes ``:owner`` and ``#<permit>``), so this leaves every key
at least 87 characters of its own."""


@dataclasses.dataclass(frozen=True)
class LocksSettings:
    """``LOCKS`` after validation."""

    backend: type[LockStore]
    backend_path: str
    options: dict[str, Any]
    ttl_ms: int
    min_hold_ms: int
    allow_in_memory_storage: bool
    celery_beat_leader: bool
    clock: Clock | None
    metrics: tuple[str, ...] = ()
    key_prefix: str = ""
    max_hold_ms: int | None = None

    @property
    def in_memory(self) -> bool:
        from django_locks.stores.memory import InMemoryStore

        return issubclass(self.backend, InMemoryStore)


def read(raw: object = None) -> LocksSettings:
    """Validate ``raw`` (default: ``settings.LOCKS``).

    Raises ``ImproperlyConfigured`` with the fix in the message.
    """
    if raw is None:
        raw = getattr(settings, "LOCKS", {})
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(f"LOCKS must be a dict, got {type(raw).__name__}.")
    unknown = sorted(set(raw) - set(DEFAULTS))
    if unknown:
        raise ImproperlyConfigured(
            f"LOCKS has unknown keys {unknown}; the known keys are {sorted(DEFAULTS)}."
        )
    values = {**DEFAULTS, **raw}
    path = values["BACKEND"]
    if not isinstance(path, str):
        raise ImproperlyConfigured(f"LOCKS['BACKEND'] must be a dotted path, got {path!r}.")
    try:
        backend = import_string(path)
    except ImportError as exc:
        raise ImproperlyConfigured(
            f"LOCKS['BACKEND'] {path!r} cannot be imported ({exc}). Use "
            "'django_locks.stores.DatabaseStore', 'django_locks.stores.RedisStore' or the dotted "
            "path of your own LockStore subclass (installing its extra, such as "
            "django-distributed-locks[redis])."
        ) from exc
    if not (isinstance(backend, type) and issubclass(backend, LockStore)):
        raise ImproperlyConfigured(
            f"LOCKS['BACKEND'] {path!r} is not a LockStore subclass; subclass "
            "django_locks.stores.LockStore."
        )
    options = values["OPTIONS"]
    if not isinstance(options, dict):
        raise ImproperlyConfigured(f"LOCKS['OPTIONS'] must be a dict, got {options!r}.")
    durations = {}
    for name, bounded in (("TTL", ttl_ms), ("MIN_HOLD", min_hold_ms)):
        try:
            durations[name] = bounded(values[name], name=f"LOCKS['{name}']")
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(str(exc)) from exc
    try:
        max_hold = max_hold_ms(values["MAX_HOLD"], name="LOCKS['MAX_HOLD']")
        key_prefix = check_key_prefix(values["KEY_PREFIX"], name="LOCKS['KEY_PREFIX']")
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(str(exc)) from exc
    for name in ("ALLOW_IN_MEMORY_STORAGE", "CELERY_BEAT_LEADER"):
        if not isinstance(values[name], bool):
            raise ImproperlyConfigured(
                f"LOCKS['{name}'] must be True or False, got {values[name]!r}."
            )
    return LocksSettings(
        backend=backend,
        backend_path=path,
        options=dict(options),
        ttl_ms=durations["TTL"],
        min_hold_ms=durations["MIN_HOLD"],
        allow_in_memory_storage=values["ALLOW_IN_MEMORY_STORAGE"],
        celery_beat_leader=values["CELERY_BEAT_LEADER"],
        clock=_read_clock(values["CLOCK"]),
        metrics=_read_metrics(values["METRICS"]),
        key_prefix=key_prefix,
        max_hold_ms=max_hold,
    )


def check_key_prefix(value: object, *, name: str = "key_prefix") -> str:
    """``value`` if it is a valid key prefix: a ``str`` (``""``: none) of at most
    :data:`MAX_KEY_PREFIX_LENGTH` characters, any Unicode but NUL and lone surrogates (it
    becomes the start of every key). ``TypeError`` / ``ValueError`` naming ``name``, the rule
    and the value otherwise."""
    if not isinstance(value, str):
        raise TypeError(
            f"`{name}` must be a str prepended to every key ('' for none), got "
            f"{type(value).__name__} {value!r}"
        )
    if len(value) > MAX_KEY_PREFIX_LENGTH:
        raise ValueError(
            f"`{name}` must be at most {MAX_KEY_PREFIX_LENGTH} characters: it counts towards "
            f"the {MAX_KEY_LENGTH} characters of every key, got {len(value)}: {value[:40]!r}..."
        )
    if "\x00" in value:
        raise ValueError(f"`{name}` must not contain NUL characters, got {value!r}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"`{name}` must not contain lone surrogates (it must encode as UTF-8), got {value!r}"
        ) from None
    return value


def _read_metrics(value: object) -> tuple[str, ...]:
    """``LOCKS["METRICS"]``: a list of exporter names, each known and named once."""
    if isinstance(value, str) or not isinstance(value, (list, tuple)):
        raise ImproperlyConfigured(
            f"LOCKS['METRICS'] must be a list of exporter names (of {list(EXPORTERS)}), got "
            f"{value!r}; for example LOCKS['METRICS'] = ['prometheus']."
        )
    unknown = [name for name in value if name not in EXPORTERS]
    if unknown:
        raise ImproperlyConfigured(
            f"LOCKS['METRICS'] names {', '.join(map(repr, unknown))}; the exporters are "
            f"{', '.join(map(repr, EXPORTERS))}."
        )
    if len(set(value)) != len(value):
        raise ImproperlyConfigured(f"LOCKS['METRICS'] names an exporter twice: {value!r}.")
    return tuple(value)


def _read_clock(value: object) -> Clock | None:
    if value is None or isinstance(value, Clock):
        return value
    if isinstance(value, str):
        try:
            value = import_string(value)
        except ImportError as exc:
            raise ImproperlyConfigured(
                f"LOCKS['CLOCK'] {value!r} cannot be imported ({exc})."
            ) from exc
        if isinstance(value, type) and issubclass(value, Clock):
            return value()
        if isinstance(value, Clock):
            return value
    raise ImproperlyConfigured(
        f"LOCKS['CLOCK'] must be None, a Clock instance or the dotted path of one, got {value!r}."
    )


def build_store(config: LocksSettings) -> LockStore:
    """Instantiate the configured store (stores connect lazily: no I/O here). A store whose
    leases run on a clock it is given says so (``takes_clock``, as ``InMemoryStore`` does): it
    gets ``LOCKS["CLOCK"]`` as its ``clock`` option unless ``OPTIONS`` names one."""
    options = dict(config.options)
    _refuse_unknown_options(config, options)
    if config.clock is not None and takes_clock(config.backend):
        options.setdefault("clock", config.clock)
    try:
        return config.backend(**options)
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(
            f"LOCKS['OPTIONS'] are not valid for {config.backend_path}: {exc}"
        ) from exc


def takes_clock(backend: type[LockStore]) -> bool:
    """Whether stores of ``backend`` keep their leases on the clock they are given (a class
    attribute of the store; none of the server stores, whose clock is the server's)."""
    return getattr(backend, "takes_clock", False) is True


def _refuse_unknown_options(config: LocksSettings, options: dict[str, Any]) -> None:
    """Name an option the store does not take, and the ones it does (not Python's "unexpected
    keyword argument")."""
    try:
        parameters = inspect.signature(config.backend).parameters
    except (TypeError, ValueError):
        return  # no signature to read: the store's own error will do
    if any(p.kind is p.VAR_KEYWORD for p in parameters.values()):
        return
    valid = sorted(
        name
        for name, p in parameters.items()
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and name != "clock"
    )
    unknown = sorted(set(options) - set(parameters))
    if unknown:
        raise ImproperlyConfigured(
            f"LOCKS['OPTIONS'] has {', '.join(map(repr, unknown))}, which "
            f"{config.backend_path} does not take; its options are "
            f"{', '.join(map(repr, valid)) or 'none'}."
        )


def refuse_in_memory_in_production(config: LocksSettings, *, debug: bool) -> None:
    """The in-memory store only protects one process: refuse it unless DEBUG or opted in."""
    if config.in_memory and not debug and not config.allow_in_memory_storage:
        raise ImproperlyConfigured(
            "LOCKS['BACKEND'] is the InMemoryStore while DEBUG is False: it only protects one "
            "process, so every instance would run the jobs it is meant to run once. Use "
            "'django_locks.stores.DatabaseStore', 'django_locks.stores.RedisStore' or "
            "'django_locks.stores.EtcdStore', or set "
            "LOCKS['ALLOW_IN_MEMORY_STORAGE'] = True if you really mean it."
        )


@functools.cache
def get() -> LocksSettings:
    """The validated ``LOCKS`` setting, read once (``reset()`` forgets it)."""
    return read()


def reset() -> None:
    """Forget the settings (``LOCKS`` changed): the next ``get()`` reads them again."""
    get.cache_clear()


_configured_debug: bool | None = None


def remember_debug(value: bool) -> None:
    """Record the project's own ``DEBUG`` (from ``ready()``, and when ``override_settings``
    changes it): test runners set ``settings.DEBUG = False`` behind the settings' back."""
    global _configured_debug
    _configured_debug = bool(value)


def configured_debug() -> bool:
    """The ``DEBUG`` the project's settings say, not the one a test runner put in their place:
    development-only warnings (W101) follow it (SPEC section 7)."""
    return settings.DEBUG if _configured_debug is None else _configured_debug
