"""Small field checkers for payload validation.

A checker takes a value and returns it (possibly normalised) or raises :class:`PayloadError`
with a message that names what is wrong. Payload classes compose them into record specs, so
validation reads as a table of fields rather than as nested ``if`` statements.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

__all__ = [
    "PayloadError",
    "Checker",
    "integer",
    "text",
    "boolean",
    "optional",
    "list_of",
    "json_object",
    "check_record",
]

Checker = Callable[[Any], Any]

#: Values outside signed 64 bits cannot be stored in BIGINT columns.
_INT64 = (-(2**63), 2**63 - 1)


class PayloadError(ValueError):
    """A payload that does not follow its schema; the message is the rejects table's reason."""


def integer(value: Any) -> int:
    if type(value) is not int:
        raise PayloadError(f"expected an integer, got {type(value).__name__}")
    if not _INT64[0] <= value <= _INT64[1]:
        raise PayloadError(f"integer {value} does not fit in 64 bits")
    return value


def text(value: Any) -> str:
    if type(value) is not str:
        raise PayloadError(f"expected a string, got {type(value).__name__}")
    return value


def boolean(value: Any) -> bool:
    if type(value) is not bool:
        raise PayloadError(f"expected a boolean, got {type(value).__name__}")
    return value


def optional(check: Checker) -> Checker:
    def check_optional(value: Any) -> Any:
        return None if value is None else check(value)

    return check_optional


def list_of(check: Checker) -> Checker:
    def check_list(value: Any) -> list:
        if not isinstance(value, (list, tuple)):
            raise PayloadError(f"expected a list, got {type(value).__name__}")
        return [check(item) for item in value]

    return check_list


def json_object(value: Any) -> dict:
    """A map of string keys to JSON-representable values with finite numbers."""
    if not isinstance(value, dict):
        raise PayloadError(f"expected a map, got {type(value).__name__}")
    _check_json(value, depth=0)
    return value


def _check_json(value: Any, depth: int) -> None:
    if depth > 32:
        raise PayloadError("nested deeper than 32 levels")
    if isinstance(value, dict):
        for key, item in value.items():
            if type(key) is not str:
                raise PayloadError(f"map key {key!r} is not a string")
            _check_json(item, depth + 1)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _check_json(item, depth + 1)
    elif isinstance(value, float):
        if not math.isfinite(value):
            raise PayloadError(f"number {value} is not finite")
    elif value is not None and type(value) not in (str, int, bool):
        raise PayloadError(f"{type(value).__name__} is not a JSON value")


def check_record(record: Any, spec: Mapping[str, tuple[Checker, bool]], what: str) -> dict[str, Any]:
    """Validate one map against ``{field: (checker, required)}``; unknown fields are dropped.

    Dropping unknown fields (rather than refusing them) lets a newer producer add optional
    fields without breaking an older materializer.
    """
    if not isinstance(record, dict):
        raise PayloadError(f"{what}: expected a map, got {type(record).__name__}")
    out: dict[str, Any] = {}
    for name, (check, required) in spec.items():
        if name not in record or record[name] is None:
            if required:
                raise PayloadError(f"{what}: required field {name!r} is missing")
            out[name] = None
            continue
        try:
            out[name] = check(record[name])
        except PayloadError as exc:
            raise PayloadError(f"{what}: field {name!r}: {exc}") from None
    return out
