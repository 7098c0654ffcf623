"""Instruction failures: how exceptions become PROTOCOL §7.6 error objects."""

from __future__ import annotations

import asyncio
import os
import traceback
from dataclasses import dataclass
from types import TracebackType
from typing import Any

from kcoral.protocol.errors import ExecutionError

TRACEBACK_LIMIT = 8192

# Frames of the worker itself (and of asyncio, which awaits coroutines for us) are noise in
# a user's traceback: the leading ones are dropped so the first frame is uploaded code.
_WORKER_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_ASYNCIO_DIR = os.path.dirname(os.path.abspath(asyncio.__file__)) + os.sep


class InstructionFailure(Exception):
    """Fails the running instruction with ``kind`` and ``message``."""

    def __init__(
        self,
        kind: str,
        message: str,
        traceback_text: str = "",
        where: Attribution | None = None,
    ) -> None:
        super().__init__(kind, message)
        self.kind = kind
        self.message = message
        self.traceback = traceback_text
        self.where = where  # set when the failure belongs to another instruction


@dataclass(frozen=True)
class Attribution:
    """The instruction an error is charged to."""

    index: int
    op: str
    id: str | None


def error_object(
    kind: str, message: str, where: Attribution, traceback_text: str = ""
) -> dict[str, Any]:
    """The exact six-field error object (plus the gpu_access fields for that kind)."""
    error: dict[str, Any] = {
        "kind": kind,
        "message": message,
        "instruction_index": where.index,
        "instruction_op": where.op,
        "instruction_id": where.id,
        "traceback": traceback_text[-TRACEBACK_LIMIT:],
    }
    if kind == "gpu_access":  # the field set of §7.6 must stay exact for this kind too
        error.setdefault("cuda_call", "")
        error.setdefault("location", "an unknown call site")
        error.setdefault("interfered_request_id", None)
    return error


def exception_text(exc: BaseException) -> str:
    """``<ExceptionType>: <text>`` (just the type when the text is empty)."""
    name = type(exc).__name__
    try:
        text = str(exc)
    except Exception:  # a broken __str__ must not break error reporting
        text = "<unprintable>"
    return f"{name}: {text}" if text else name


def format_user_traceback(exc: BaseException) -> str:
    """Traceback of ``exc`` starting at the first frame that is not the worker's own."""
    tb: TracebackType | None = exc.__traceback__
    while tb is not None and _is_internal(tb.tb_frame.f_code.co_filename):
        tb = tb.tb_next
    try:
        text = "".join(traceback.format_exception(type(exc), exc, tb))
    except Exception:
        text = exception_text(exc) + "\n"
    return text[-TRACEBACK_LIMIT:]


def _is_internal(filename: str) -> bool:
    return filename.startswith(_WORKER_DIR) or filename.startswith(_ASYNCIO_DIR)


def classify(exc: BaseException) -> InstructionFailure:
    """Turn an exception raised by uploaded code into an instruction failure (§5.3)."""
    if isinstance(exc, InstructionFailure):
        return exc
    tb = format_user_traceback(exc)
    if isinstance(exc, ExecutionError):
        return InstructionFailure(exc.kind, exc.message, tb)
    if isinstance(exc, AssertionError):
        return InstructionFailure("correctness", exception_text(exc), tb)
    from kcoral_server.worker.confinement import limit_note  # only needed on failures

    note = limit_note(exc)
    text = exception_text(exc) if note is None else f"{exception_text(exc)} ({note})"
    return InstructionFailure("runtime", text, tb)
