"""Strict JSON (PROTOCOL.md §3.2 row 10, CLIENT_API.md §10 point 3) and compact encoding."""

from __future__ import annotations

import json
import math
from typing import Any

from kcoral.protocol.errors import ValidationError


def _reject_constant(name: str) -> Any:
    raise ValidationError(f"JSON literal {name} is not allowed")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise ValidationError(f"duplicate key {key!r} in JSON object")
        result[key] = value
    return result


_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicates, parse_constant=_reject_constant)


def loads_strict(data: bytes | bytearray | memoryview | str) -> Any:
    """Decode UTF-8 JSON, refusing invalid UTF-8, duplicate keys and NaN/Infinity.

    Raises ``ValidationError`` with a short reason.
    """
    if isinstance(data, str):
        text = data
    else:
        try:
            text = bytes(data).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ValidationError(f"JSON is not valid UTF-8: {exc.reason}") from None
    try:
        value, end = _DECODER.raw_decode(text, _skip_whitespace(text, 0))
    except ValidationError:
        raise
    except json.JSONDecodeError as exc:
        raise ValidationError(f"invalid JSON: {exc.msg} at position {exc.pos}") from None
    except ValueError as exc:  # e.g. an integer literal beyond int_max_str_digits
        raise ValidationError(f"invalid JSON: {exc}") from None
    except RecursionError:
        raise ValidationError("invalid JSON: nested too deeply") from None
    if _skip_whitespace(text, end) != len(text):
        raise ValidationError(f"invalid JSON: extra data at position {end}")
    return value


def _skip_whitespace(text: str, index: int) -> int:
    while index < len(text) and text[index] in " \t\n\r":
        index += 1
    return index


def nested_deeper_than(value: Any, depth: int) -> bool:
    """True when decoded JSON ``value`` nests arrays and objects more than ``depth`` levels
    deep (walked without recursion, so any depth is measured)."""
    pending = [(value, 1)]
    while pending:
        item, level = pending.pop()
        if isinstance(item, (dict, list)):
            if level > depth:
                return True
            children = item.values() if isinstance(item, dict) else item
            pending.extend((child, level + 1) for child in children)
    return False


def finite_float(value: object) -> float | None:
    """``float(value)`` for a finite JSON number, else None: a bool, another type, and an
    integer beyond float range (strict JSON allows 4,300 digits) are None. Every screen that
    does arithmetic on a number a server sent goes through this, so none overflows."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        number = float(value)
    except OverflowError:  # an int beyond float range
        return None
    return number if math.isfinite(number) else None


def dumps_compact(value: Any) -> bytes:
    """Compact UTF-8 JSON, non-ASCII kept, NaN/Infinity refused (``ValueError``)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode(
        "utf-8"
    )
