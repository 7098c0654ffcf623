"""The ``X-KCoral-Serialization`` admission rule and the variable that configures it
(EXTENSIONS.md §4).

``kcoral server`` reads ``KCORAL_ALLOWED_SERIALIZATION`` with ``allowed_serialization``
(``settings.command_line``); the ``/execute`` handler calls ``check_serialization`` after the
413 check and before reading the body (``front_door.handlers.execute``). The admitted format
travels to the worker in ``RunProgram.serialization`` and from there to
``kcoral_server.worker.trampoline.admitted_serialization``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from kcoral.protocol.errors import ValidationError
from kcoral.protocol.headers import SERIALIZATION_FORMATS, SERIALIZATION_HEADER

ENV_VAR = "KCORAL_ALLOWED_SERIALIZATION"
KNOWN_FORMATS: tuple[str, ...] = SERIALIZATION_FORMATS
DEFAULT_ALLOWED: tuple[str, ...] = SERIALIZATION_FORMATS


def allowed_serialization(environ: Mapping[str, str] | None = None) -> list[str]:
    """Allowed formats from ``KCORAL_ALLOWED_SERIALIZATION`` (default ``json,pickle``).

    Comma-separated, spaces ignored, order kept, duplicates dropped; an empty or blank value
    counts as unset. ``ValueError`` for an unknown name: a configuration mistake stops the
    server at start-up (``kcoral server`` exits with status 2) instead of failing requests.
    """
    environ = os.environ if environ is None else environ
    raw = environ.get(ENV_VAR)
    if raw is None or not raw.strip():
        return list(DEFAULT_ALLOWED)
    allowed: list[str] = []
    for name in (item.strip() for item in raw.split(",")):
        if not name:
            continue
        if name not in KNOWN_FORMATS:
            raise ValueError(
                f"{ENV_VAR}: unknown serialization format {name!r}; "
                f"known formats: {list(KNOWN_FORMATS)}"
            )
        if name not in allowed:
            allowed.append(name)
    return allowed


def check_serialization(header_values: Sequence[str], allowed: Sequence[str]) -> str | None:
    """The format a request is admitted with, or ``None`` when it sent no header.

    ``header_values`` are all ``X-KCoral-Serialization`` values of the request. Raises
    ``ValidationError`` (400, kind ``parse``) for a repeated header, an unknown format, or a
    format not in ``allowed``.
    """
    if not header_values:
        return None
    if len(header_values) > 1:
        raise ValidationError(f"{SERIALIZATION_HEADER} must appear at most once")
    name = header_values[0].strip()
    if name not in KNOWN_FORMATS:
        raise ValidationError(
            f"Unknown serialization format {name!r}. Known formats: {list(KNOWN_FORMATS)}"
        )
    if name not in allowed:
        raise ValidationError(
            f"Serialization format {name!r} not allowed. Allowed formats: {list(allowed)}"
        )
    return name
