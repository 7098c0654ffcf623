"""The largest answer the client reads (``max_answer_bytes``, EXTENSIONS §17).

A server's answer is read into memory. Under Linux's overcommit a body larger than the
machine holds does not fail its allocation: the process grows until the OOM killer ends it
(a notebook kernel with every variable in it), so "a ``MemoryError`` is a
``TransportError``" protects nobody. The client therefore bounds what it reads: a declared
``Content-Length`` over the bound is refused before any of the body is read, and a body of
no stated length is cut once it passes it.

Unless the user names a bound, it is the smaller of ``DEFAULT_ANSWER_CAP_BYTES`` and half of
the memory the machine has available (``MemAvailable`` of ``/proc/meminfo``) when the body
starts: decoding copies every value out of the body, so an answer needs about twice its
size.
"""

from __future__ import annotations

import os
from typing import NamedTuple

from kcoral.errors import AnswerTooLarge, answered_but_line

#: The default bound where the machine's available memory is larger (or unknown).
DEFAULT_ANSWER_CAP_BYTES = 64 << 30

_MEMINFO = "/proc/meminfo"
#: the bound where the code does not build the client (a notebook's ``%kcoral``, ``kcoral run``)
MAX_ANSWER_ENV = "KCORAL_MAX_ANSWER_BYTES"


def chosen_bound(max_answer_bytes: int | None) -> int | None:
    """The bound the user named: ``max_answer_bytes``, else ``KCORAL_MAX_ANSWER_BYTES``;
    None (bounded by the machine) when neither is set. ``TypeError``/``ValueError`` naming
    the one that is no whole number of bytes of at least 1."""
    where = "max_answer_bytes"
    if max_answer_bytes is None:
        text = os.environ.get(MAX_ANSWER_ENV, "").strip()
        if not text:
            return None
        where = MAX_ANSWER_ENV
        try:
            max_answer_bytes = int(text)
        except ValueError:
            raise ValueError(f"{where} must be a whole number of bytes, not {text!r}") from None
    elif isinstance(max_answer_bytes, bool) or not isinstance(max_answer_bytes, int):
        raise TypeError(f"{where} must be an int or None")
    if max_answer_bytes < 1:
        raise ValueError(f"{where} must be at least 1")
    return max_answer_bytes


class AnswerLimit(NamedTuple):
    """A bound on one answer's body, and where it came from, in words."""

    size: int
    source: str


def answer_limit(max_answer_bytes: int | None) -> AnswerLimit:
    """The bound for a body starting now: ``max_answer_bytes`` when the user named one,
    else the default (the smaller of the cap and half of the available memory)."""
    if max_answer_bytes is not None:
        return AnswerLimit(max_answer_bytes, "its max_answer_bytes")
    available = available_memory_bytes()
    if available is None or available // 2 >= DEFAULT_ANSWER_CAP_BYTES:
        return AnswerLimit(DEFAULT_ANSWER_CAP_BYTES, "its default cap")
    return AnswerLimit(available // 2, "half the memory available here")


def available_memory_bytes() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes; None where there is none (not
    Linux, or a kernel without the line)."""
    try:
        with open(_MEMINFO, "rb") as meminfo:
            for line in meminfo:
                if line.startswith(b"MemAvailable:"):
                    return int(line.split()[1]) * 1024  # the kernel says kB, meaning KiB
    except (OSError, ValueError, IndexError):
        return None
    return None


def answer_too_large(url: str, size: int, limit: AnswerLimit, *, declared: bool) -> AnswerTooLarge:
    """The error of an answer over ``limit``: ``declared`` (its ``Content-Length`` said
    ``size``), else cut once ``size`` bytes came."""
    said = f"its answer is {sized(size)}" if declared else f"its answer passed {sized(size)}"
    trouble = (
        f"{said}, more than the {sized(limit.size)} this client reads ({limit.source}): "
        f"pass max_answer_bytes= to the client, or set {MAX_ANSWER_ENV}, to read more"
    )
    return AnswerTooLarge(answered_but_line(url, trouble), url=url, answered_but=trouble)


def sized(count: int) -> str:
    """``count`` bytes in the largest binary unit that keeps it at least 1."""
    for unit, shift in (("TiB", 40), ("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if count >= 1 << shift:
            return f"{count / (1 << shift):.1f} {unit}"
    return f"{count} bytes"
