"""HTTP answers of the execution pipeline and the encoding of a program's outcome (§7, §10).

``Reply`` is what a handler writes (or a job stores); ``encode_outcome`` turns what a worker
produced into the ``COMPLETED``/``FAILED`` answer, JSON or multipart, without copying the
return parts (they stay views of the worker's memfds until the reply is closed).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import mmap
from dataclasses import dataclass, field
from typing import Any

from kcoral.protocol.multipart import encode_multipart
from kcoral.protocol.strict_json import dumps_compact
from kcoral_server.storage.workspace import CapturedOutput


@dataclass
class Reply:
    """An HTTP answer: status, headers and body chunks (zero-copy views allowed)."""

    status: int
    headers: dict[str, str]
    chunks: list[bytes | memoryview]
    length: int
    keep_alive: list[mmap.mmap] = field(default_factory=list)  # maps backing the chunks

    def close(self) -> None:
        self.chunks = []
        for item in self.keep_alive:
            try:
                item.close()
            except BufferError:
                close_when_released(item)
            except ValueError:
                pass
        self.keep_alive = []


def close_when_released(item: mmap.mmap, attempts: int = 10) -> None:
    """Close a mapping whose views are still exported, once they are gone.

    A write cut short by a disconnecting client leaves the views in Tornado's frames, which
    sit in a reference cycle with the stream's exception; only the cycle collector frees
    them. Each mapping holds a descriptor, so do not wait for a collection by chance."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:  # no loop (a thread or a test): collect now, once
        gc.collect()
        with contextlib.suppress(BufferError, ValueError):
            item.close()
        return

    def retry(left: int) -> None:
        gc.collect()
        try:
            item.close()
        except BufferError:
            if left > 1:
                loop.call_later(1.0, retry, left - 1)
        except ValueError:
            pass

    loop.call_later(0.2, retry, attempts)


def json_reply(status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> Reply:
    data = dumps_compact(body)
    all_headers = {"Content-Type": "application/json", **(headers or {})}
    return Reply(status, all_headers, [data], len(data))


def error_reply(
    status: int, request_id: str, kind: str, message: str, output: CapturedOutput | None = None
) -> Reply:
    """An ``ERROR`` body (PROTOCOL §7.4); ``output``, where given (a program cut by its
    deadline), adds what it printed as a ``COMPLETED`` body carries it (EXTENSIONS §15)."""
    headers = {"Retry-After": "1"} if status == 503 else {}
    body: dict[str, Any] = {
        "status": "ERROR",
        "request_id": request_id,
        "error": {"kind": kind, "message": message},
    }
    if output is not None:
        body.update(output_fields(output))
        if output.order:  # asked for, and both streams written (EXTENSIONS §16)
            body["output_order"] = [list(run) for run in output.order]
    return json_reply(status, body, headers)


def output_fields(output: CapturedOutput) -> dict[str, Any]:
    """``stdout``, ``stderr`` and their truncation flags (PROTOCOL §7.2)."""
    return {
        "stdout": output.stdout,
        "stderr": output.stderr,
        "stdout_truncated": output.stdout_truncated,
        "stderr_truncated": output.stderr_truncated,
    }


class RequestFailed(Exception):
    """Ends a request early with an ERROR reply and a finish reason; ``error_detail`` is
    logged (``request_finished``), never answered; ``output`` is what the program printed,
    answered beside the error (a program past its deadline, EXTENSIONS §15)."""

    def __init__(
        self,
        status: int,
        kind: str,
        message: str,
        reason: str,
        *,
        error_detail: str | None = None,
        output: CapturedOutput | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind
        self.message = message
        self.reason = reason
        self.error_detail = error_detail
        self.output = output


@dataclass(frozen=True)
class Refusal:
    """An ``ERROR`` answer the server gives in more than one place: its HTTP status, error
    kind and message, and the ``finish_reason`` it is logged with."""

    status: int
    kind: str
    message: str
    reason: str

    def failure(self) -> RequestFailed:
        """The refusal as the exception that ends a running request."""
        return RequestFailed(self.status, self.kind, self.message, self.reason)


#: PROTOCOL §7.1: no seat within the wait, the server closing or past its in-flight bytes,
#: or a GPU quarantined under the program; the client may retry (``Retry-After``)
SATURATED = Refusal(503, "busy", "server saturated", "no_worker")

#: the why of the 503s whose cause the caller cannot tell from "saturated" alone
SHUTTING_DOWN = "the server is shutting down"
NO_FREE_WORKER = "no worker became free within --worker-wait-timeout-seconds"
GPUS_QUARANTINED = "the GPUs this program needs are quarantined (a worker's end was not confirmed)"
QUARANTINED = (
    "it admits no program since a worker's end could not be confirmed (its log says which); "
    "its operator must restart it"
)


def saturated(why: str | None) -> Refusal:
    """``SATURATED`` whose message says why (PROTOCOL §7.1, differs here): ``server
    saturated: <why>``. Said so the caller can tell a wait worth retrying from a server
    that will admit nothing until its operator acts; the kind stays ``busy``."""
    if not why:
        return SATURATED
    return Refusal(
        SATURATED.status, SATURATED.kind, f"{SATURATED.message}: {why}", SATURATED.reason
    )


@dataclass
class ReturnRecord:
    key: str
    node: dict[str, Any]
    parts: list[memoryview]


@dataclass
class ProgramOutcome:
    """What running the program produced (before the response is encoded)."""

    status: str
    error: dict[str, Any] | None
    returns: list[ReturnRecord]
    output: CapturedOutput
    elapsed: float
    lease_wait: float
    lease_held: float
    reason: str
    maps: list[mmap.mmap]
    gpu_ids: list[int] | None = None


def encode_outcome(
    outcome: ProgramOutcome, request_id: str, queue_ms: float, max_response_bytes: int
) -> Reply:
    """The 200 answer for ``outcome`` (PROTOCOL §7); ``RequestFailed`` when it cannot be
    encoded or exceeds ``max_response_bytes``."""
    result: dict[str, Any] = {
        "status": outcome.status,
        "request_id": request_id,
        "queue_ms": queue_ms,
        "elapsed_ms": outcome.elapsed * 1000.0,
        "lease_wait_ms": outcome.lease_wait * 1000.0,
        "lease_held_ms": outcome.lease_held * 1000.0,
    }
    if outcome.gpu_ids is not None:
        result["gpu_ids"] = outcome.gpu_ids
        result["gpu_count"] = len(outcome.gpu_ids)
    result.update(output_fields(outcome.output))
    result["results"] = {r.key: r.node for r in outcome.returns}
    if outcome.error is not None:
        result["error"] = outcome.error
    if outcome.output.order:  # asked for, and both streams written (EXTENSIONS §16)
        result["output_order"] = [list(run) for run in outcome.output.order]
    try:
        data = dumps_compact(result)
    except (TypeError, ValueError):
        close_maps(outcome.maps)
        raise RequestFailed(500, "engine", "invalid worker response", "server_error") from None
    parts = [part for record in outcome.returns for part in record.parts]
    if parts:
        named = [("result", "application/json", data)] + [
            (f"return:{i}", "application/octet-stream", part) for i, part in enumerate(parts)
        ]
        content_type, chunks, length = encode_multipart(named)
        reply = Reply(200, {"Content-Type": content_type}, chunks, length, list(outcome.maps))
    else:
        close_maps(outcome.maps)
        reply = Reply(200, {"Content-Type": "application/json"}, [data], len(data))
    if reply.length > max_response_bytes:
        reply.close()
        raise too_large(reply.length, max_response_bytes)
    return reply


def too_large(length: int, max_response_bytes: int) -> RequestFailed:
    """The 500 ``response_too_large`` of results of ``length`` bytes (an answer, or the one
    message of a worker that carried more than an answer may)."""
    # PROTOCOL §7.1's fixed text first; then the sizes and the flag (EXTENSIONS §10).
    return RequestFailed(
        500,
        "response_too_large",
        f"results exceed the configured response-size limit: {length} bytes, limit "
        f"{max_response_bytes} bytes (max_response_bytes; kcoral server --max-response-bytes)",
        "server_error",
    )


def close_maps(maps: list[mmap.mmap]) -> None:
    for mapped in maps:
        with contextlib.suppress(BufferError, ValueError):
            mapped.close()
