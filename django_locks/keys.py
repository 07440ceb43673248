"""Lock keys: validation, and templates formatted from a call's arguments."""

from __future__ import annotations

import inspect
import string
from collections.abc import Callable, Mapping
from typing import Any

MAX_KEY_LENGTH = 500


def validate_key(key: object, *, name: str = "key", suffix: str = "") -> str:
    """Return ``key`` if it is a valid lock key (with ``suffix`` appended, if any).

    A key is a ``str`` of 1 to 500 characters (``suffix`` included, for derived keys such as
    ``<key>:owner``), any Unicode except NUL and lone surrogates, kept exactly as given.
    """
    if not isinstance(key, str):
        raise TypeError(f"`{name}` must be a str, got {type(key).__name__} {key!r}")
    if not key:
        raise ValueError(f"`{name}` must be 1 to {MAX_KEY_LENGTH} characters, got ''")
    full = key + suffix
    if len(full) > MAX_KEY_LENGTH:
        derived = f" once {suffix!r} is appended" if suffix else ""
        raise ValueError(
            f"`{name}` must be 1 to {MAX_KEY_LENGTH} characters{derived}, "
            f"got {len(full)}: {key[:40]!r}..."
        )
    if "\x00" in key:
        raise ValueError(f"`{name}` must not contain NUL characters, got {key!r}")
    try:
        key.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError(
            f"`{name}` must not contain lone surrogates (it must encode as UTF-8), got {key!r}"
        ) from None
    return full


def template_fields(template: str) -> list[str]:
    """The top-level names a key template refers to (``"report:{customer.id}"`` -> customer)."""
    names = []
    for _, field, _, _ in string.Formatter().parse(template):
        if field is None:
            continue
        head = field.split(".", 1)[0].split("[", 1)[0]
        if not head or head.isdigit():
            raise ValueError(
                f"key template {template!r} must name the function's arguments "
                f"(such as '{{customer_id}}'), got {{{field}}}"
            )
        names.append(head)
    return names


def check_template(template: str, func: Callable[..., Any]) -> None:
    """Fail at decoration time if ``template`` names an argument ``func`` does not take."""
    params = inspect.signature(func).parameters
    takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in params.values())
    for field in template_fields(template):
        if field not in params and not takes_kwargs:
            raise ValueError(
                f"key template {template!r} names {field!r}, which "
                f"{func.__qualname__}() does not take"
            )


def render_key(
    template: str, func: Callable[..., Any], args: tuple[Any, ...], kwargs: Mapping[str, Any]
) -> str:
    """Format ``template`` with the arguments of one call of ``func`` (defaults applied)."""
    if not template_fields(template):
        return template
    bound = inspect.signature(func).bind(*args, **kwargs)
    bound.apply_defaults()
    values = dict(bound.arguments)
    for param in inspect.signature(func).parameters.values():
        if param.kind is param.VAR_KEYWORD:
            values.update(values.pop(param.name, {}))
    return template.format(**values)
