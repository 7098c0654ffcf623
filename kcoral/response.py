"""Strict validation and decoding of ``/execute`` and ``/health`` answers (CLIENT_API.md §9–§10).

Pure functions over ``(status, content type, body)`` so the sync and async clients share
them. Any rule a 200 response breaks raises ``ProtocolError``; a non-200 answer becomes a
``KCoralError`` built from its ``ERROR`` body.
"""

from __future__ import annotations

import hashlib
import re
import threading
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import urlsplit

import numpy as np

from kcoral.bench.results import as_bench_result
from kcoral.errors import KCoralError, PrintedOutput, ProtocolError
from kcoral.protocol import multipart
from kcoral.protocol.dtypes import byte_length, is_dtype, numpy_can_hold, numpy_dtype
from kcoral.protocol.errors import INSTRUCTION_ERROR_KINDS, ValidationError
from kcoral.protocol.output_order import runs_of
from kcoral.protocol.strict_json import finite_float, loads_strict
from kcoral.protocol.values import NODE_FIELDS
from kcoral.results import ProgramResult, ReturnedFile, ReturnedFolder

_HASH = re.compile(r"[0-9a-f]{64}")
_TIMINGS = ("queue_ms", "elapsed_ms", "lease_wait_ms", "lease_held_ms")
_OPS = frozenset({"upload", "get_function", "run", "return"})
_ERROR_FIELDS = frozenset(
    {"kind", "message", "instruction_index", "instruction_op", "instruction_id", "traceback"}
)
_GPU_ACCESS_FIELDS = frozenset({"cuda_call", "location", "interfered_request_id"})
# From this part size on, the part is hashed in a second thread while it is copied out
# (hashing releases the GIL); below it a thread costs more than it saves.
_PARALLEL_HASH_BYTES = 1 << 20
#: Characters of each stream a 504's output keeps: PROTOCOL §10's max_output_limit_bytes,
#: which no KCoral server passes (so a genuine one is never cut here and the output-limit
#: note stays true), while a malicious server's flood stops there.
PRINTED_OUTPUT_CHARS = 16 << 20
T = TypeVar("T")


@dataclass(frozen=True)
class CacheMiss:
    """A validated ``CACHE_MISS`` answer (handled inside ``execute``, never surfaced)."""

    request_id: str
    missing_blobs: tuple[str, ...]


def media_type(content_type: str | None) -> str:
    """Lower-cased media type without parameters (``""`` when absent)."""
    return (content_type or "").split(";", 1)[0].strip().lower()


#: what of a redirect's ``Location`` a hint may show: printable ASCII without spaces (no
#: escape string reaches the terminal), short
_SHOWABLE_LOCATION = re.compile(r"[!-~]{1,200}")


def redirect_hint(status_code: int, location: str | None) -> str:
    """What a 3xx answer (CLIENT_API §9) tells the user: where it pointed, and that the
    client never follows it; ``""`` for another status.

    Who writes this: the server the URL names, malicious or not. Followed, its redirect
    would carry the user's token and program to any address it chose (the client never
    follows one); a plain ``HTTP 307`` left the user to guess why an ``http://`` URL behind
    an HTTPS proxy failed. Only the target's scheme, host and port are shown (its path and
    query may hold anything), and only when printable."""
    if not 300 <= status_code < 400:
        return ""
    target = redirect_target(location)
    return (
        f"the server answered {status_code}, a redirect to {target}, which KCoral never "
        "follows (the token and the program would go where the URL does not point): if it "
        "is the KCoral server, use its address as the URL"
    )


def redirect_target(location: str | None) -> str:
    """Where a redirect's ``Location`` points, as a hint may show it."""
    return _redirect_target(location or "") or "an address it did not say"


def _redirect_target(location: str) -> str | None:
    """``scheme://host[:port]`` of an absolute ``Location``, ``PATH on the same server``
    of a relative one; None when it does not parse or shows what a terminal acts on."""
    try:
        parts = urlsplit(location.strip())
        port = f":{parts.port}" if parts.port is not None else ""
    except ValueError:
        return None
    if parts.scheme and parts.hostname:
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        shown, where = f"{parts.scheme}://{host}{port}", ""
    else:
        shown, where = parts.path, " on the same server"
    return f"{shown}{where}" if _SHOWABLE_LOCATION.fullmatch(shown) else None


def error_from_response(
    status_code: int, headers: Mapping[str, str], body: bytes | memoryview
) -> KCoralError:
    """``KCoralError`` for a non-200 answer, from its ``ERROR`` body when that parses; a
    redirect's carries ``redirect_hint``."""
    header_request_id = headers.get("X-Request-ID") or None
    try:
        decoded = loads_strict(body)
    except ValidationError:
        decoded = None
    if isinstance(decoded, dict) and isinstance(decoded.get("error"), dict):
        error = decoded["error"]
        message = error.get("message")
        kind = error.get("kind")
        request_id = decoded.get("request_id")
        return KCoralError(
            status_code,
            message if isinstance(message, str) else "server error",
            kind=kind if isinstance(kind, str) else None,
            request_id=request_id if isinstance(request_id, str) else header_request_id,
            output=printed_output(decoded) if status_code == 504 else None,
            retry_after=retry_after_seconds(headers.get("Retry-After")),
        )
    error = KCoralError(
        status_code,
        f"HTTP {status_code}",
        request_id=header_request_id,
        retry_after=retry_after_seconds(headers.get("Retry-After")),
    )
    error.hint = redirect_hint(status_code, headers.get("Location"))
    if error.hint:
        error.redirect_to = redirect_target(headers.get("Location"))
    return error


def retry_after_seconds(value: str | None) -> float | None:
    """A ``Retry-After`` of delta-seconds (digits, at most 9 of them), else None (absent,
    an HTTP date or anything else: the caller's own pause applies)."""
    text = (value or "").strip()
    return float(text) if text.isascii() and text.isdigit() and len(text) <= 9 else None


def printed_output(body: Mapping[str, Any]) -> PrintedOutput | None:
    """What a 504 body says the program printed (EXTENSIONS §15), each stream cut to
    ``PRINTED_OUTPUT_CHARS``; ``None`` when it says nothing (a published server). A field
    of another type counts as absent: the rest of the error still reads."""
    kept: list[str] = []
    cut: list[bool] = []
    for name in ("stdout", "stderr"):
        text = body.get(name)
        text = text if isinstance(text, str) else ""
        kept.append(text[:PRINTED_OUTPUT_CHARS])
        cut.append(len(text) > PRINTED_OUTPUT_CHARS or body.get(f"{name}_truncated") is True)
    if not any(kept):
        return None
    return PrintedOutput(kept[0], kept[1], cut[0], cut[1], runs_of(body.get("output_order")))


ROUTER_UNAVAILABLE = "unavailable: no ready node of the router's default kind has connected slots"


def health_error(
    status_code: int, headers: Mapping[str, str], body: bytes | memoryview
) -> KCoralError:
    """``error_from_response`` for ``/health``. A router's 503 health body (``status:
    "unavailable"``, ROUTER §9) is no ``ERROR`` body, yet a router sent it: its message says
    why instead of ``HTTP 503``, which reads as an answer from something else than KCoral."""
    try:
        decoded = loads_strict(body)
    except ValidationError:
        decoded = None
    if status_code == 503 and isinstance(decoded, dict) and decoded.get("status") == "unavailable":
        return KCoralError(503, ROUTER_UNAVAILABLE, request_id=headers.get("X-Request-ID") or None)
    return error_from_response(status_code, headers, body)


def decode_json_object(body: bytes | memoryview, what: str) -> dict[str, Any]:
    """Strict JSON object or ``ProtocolError`` naming ``what``."""
    try:
        value = loads_strict(body)
    except ValidationError as exc:
        raise ProtocolError(f"{what}: {exc}") from None
    if not isinstance(value, dict):
        raise ProtocolError(f"{what}: expected a JSON object")
    return value


def decode_health(body: bytes | memoryview) -> dict[str, Any]:
    """Validate a 200 ``/health`` body (§2: a JSON object with ``status == "ok"``)."""
    health = decode_json_object(body, "health response")
    if health.get("status") != "ok":
        raise ProtocolError(f"health status is {health.get('status')!r}, not 'ok'")
    return health


def decode_target(health: Mapping[str, Any]) -> dict[str, str]:
    """``health["target"]``: a ``str -> str`` object containing ``arch``."""
    target = health.get("target")
    if not isinstance(target, dict) or not all(
        isinstance(key, str) and isinstance(value, str) for key, value in target.items()
    ):
        raise ProtocolError("health target is not an object of strings")
    if "arch" not in target:
        raise ProtocolError("server reports no GPU target (no 'arch'); is it a CPU server?")
    return dict(target)


def gpus_label(gpu_count: int, arch: object) -> str:
    """A server's GPUs as a user reads them (``4 GPUs (sm_90a)``, ``1 GPU``, ``CPU``), from
    its ``/health`` ``gpu_count`` and ``target.arch``; an ``arch`` that is not a string is
    left out. The server's text: screen it before a terminal shows it."""
    if gpu_count == 0:
        return "CPU"
    plural = "s" if gpu_count != 1 else ""
    return f"{gpu_count} GPU{plural}" + (f" ({arch})" if isinstance(arch, str) and arch else "")


def decode_execute_response(
    content_type: str | None, body: bytes | memoryview, known_blobs: Collection[str]
) -> ProgramResult | CacheMiss:
    """Validate a 200 ``/execute`` answer; ``known_blobs`` are the program's blob hashes."""
    kind = media_type(content_type)
    parts: dict[str, memoryview] = {}
    if kind == "application/json":
        result_bytes: bytes | memoryview = body
    elif kind == "multipart/form-data":
        result_bytes, parts = _split_multipart(content_type or "", body)
    else:
        raise ProtocolError(f"unexpected response content type {content_type!r}")
    document = decode_json_object(result_bytes, "response JSON")

    status = document.get("status")
    if status == "CACHE_MISS":
        if kind != "application/json":
            raise ProtocolError("a CACHE_MISS response must be plain JSON")
        return _cache_miss(document, known_blobs)
    if status not in ("COMPLETED", "FAILED"):
        raise ProtocolError(f"unexpected response status {status!r}")
    return _program_result(document, parts)


def _split_multipart(
    content_type: str, body: bytes | memoryview
) -> tuple[memoryview, dict[str, memoryview]]:
    try:
        boundary = multipart.boundary_from_content_type(content_type)
        if isinstance(boundary, str):
            boundary = boundary.encode("ascii")
        parsed = multipart.parse_multipart(memoryview(body), boundary)
    except (ValidationError, ValueError) as exc:
        raise ProtocolError(f"malformed multipart response: {exc}") from None
    result: memoryview | None = None
    binary: dict[str, memoryview] = {}
    for part in parsed:
        part_type = media_type(part.content_type)
        if part.name == "result":
            if result is not None:
                raise ProtocolError("multipart response has more than one 'result' part")
            if part_type != "application/json":
                raise ProtocolError("the 'result' part must be application/json")
            result = part.data
            continue
        if part.name in binary:
            raise ProtocolError(f"multipart response repeats part {part.name!r}")
        if part_type != "application/octet-stream":
            raise ProtocolError(f"part {part.name!r} must be application/octet-stream")
        binary[part.name] = part.data
    if result is None:
        raise ProtocolError("multipart response has no 'result' part")
    return result, binary


def _cache_miss(document: dict[str, Any], known_blobs: Collection[str]) -> CacheMiss:
    request_id = _request_id(document)
    missing = document.get("missing_blobs")
    if not isinstance(missing, list) or not missing:
        raise ProtocolError("CACHE_MISS needs a non-empty missing_blobs list")
    for blob in missing:
        if not isinstance(blob, str) or not _HASH.fullmatch(blob):
            raise ProtocolError(f"CACHE_MISS lists an invalid hash {blob!r}")
    if len(set(missing)) != len(missing):
        raise ProtocolError("CACHE_MISS missing_blobs has duplicates")
    for blob in missing:
        if blob not in known_blobs:
            raise ProtocolError(f"CACHE_MISS lists {blob}, which is not a blob of this program")
    return CacheMiss(request_id, tuple(missing))


def _request_id(document: dict[str, Any]) -> str:
    request_id = document.get("request_id")
    if not isinstance(request_id, str) or not request_id:
        raise ProtocolError("request_id must be a non-empty string")
    return request_id


def _program_result(document: dict[str, Any], parts: dict[str, memoryview]) -> ProgramResult:
    status = document["status"]
    request_id = _request_id(document)
    timings: dict[str, float] = {}
    for name in _TIMINGS:
        timing = finite_float(document.get(name))
        if timing is None:
            raise ProtocolError(f"{name} must be a finite number")
        timings[name] = timing
    streams: dict[str, str] = {}
    for name in ("stdout", "stderr"):
        stream = document.get(name)
        if not isinstance(stream, str):
            raise ProtocolError(f"{name} must be a string")
        streams[name] = stream
    flags: dict[str, bool] = {}
    for name in ("stdout_truncated", "stderr_truncated"):
        flag = document.get(name, False)
        if not isinstance(flag, bool):
            raise ProtocolError(f"{name} must be a boolean")
        flags[name] = flag
    gpu_ids = _gpu_ids(document)

    raw_results = document.get("results")
    if not isinstance(raw_results, dict):
        raise ProtocolError("results must be an object")
    decoder = _NodeDecoder(parts)
    try:
        results = {key: decoder.decode(node, key) for key, node in raw_results.items()}
    except RecursionError:
        raise ProtocolError("results are nested too deeply") from None
    decoder.finish()

    if status == "COMPLETED":
        if "error" in document:
            raise ProtocolError("a COMPLETED response must not carry an error")
        error = None
    else:
        error = _instruction_error(document.get("error"))
    return ProgramResult(
        status,
        request_id,
        queue_ms=timings["queue_ms"],
        elapsed_ms=timings["elapsed_ms"],
        lease_wait_ms=timings["lease_wait_ms"],
        lease_held_ms=timings["lease_held_ms"],
        results=results,
        stdout=streams["stdout"],
        stderr=streams["stderr"],
        stdout_truncated=flags["stdout_truncated"],
        stderr_truncated=flags["stderr_truncated"],
        error=error,
        gpu_ids=gpu_ids,
        # only a hint for the order: a malformed one is dropped, never an error (§16)
        output_order=runs_of(document.get("output_order")),
    )


def _gpu_ids(document: dict[str, Any]) -> tuple[int, ...]:
    if ("gpu_ids" in document) != ("gpu_count" in document):
        raise ProtocolError("gpu_ids and gpu_count must be both present or both absent")
    if "gpu_ids" not in document:
        return ()
    ids = document["gpu_ids"]
    count = document["gpu_count"]
    if not isinstance(ids, list) or not 1 <= len(ids) <= 8:
        raise ProtocolError("gpu_ids must be a list of 1 to 8 GPU ids")
    if not all(_is_int(gpu) and gpu >= 0 for gpu in ids) or len(set(ids)) != len(ids):
        raise ProtocolError("gpu_ids must be distinct non-negative integers")
    if not _is_int(count) or count != len(ids):
        raise ProtocolError("gpu_count must be an integer equal to len(gpu_ids)")
    return tuple(ids)


def _instruction_error(error: object) -> dict[str, Any]:
    if not isinstance(error, dict):
        raise ProtocolError("a FAILED response needs an error object")
    expected = set(_ERROR_FIELDS)
    if error.get("kind") == "gpu_access":
        expected |= _GPU_ACCESS_FIELDS
    if set(error) != expected:
        raise ProtocolError(f"error fields {sorted(error)} differ from {sorted(expected)}")
    if error["kind"] not in INSTRUCTION_ERROR_KINDS:
        raise ProtocolError(f"unknown instruction error kind {error['kind']!r}")
    if not _is_int(error["instruction_index"]):
        raise ProtocolError("error.instruction_index must be an integer")
    if error["instruction_op"] not in _OPS:
        raise ProtocolError(f"unknown error.instruction_op {error['instruction_op']!r}")
    for name in ("instruction_id", "interfered_request_id"):
        if name in error and error[name] is not None and not isinstance(error[name], str):
            raise ProtocolError(f"error.{name} must be a string or null")
    for name in ("message", "traceback", "cuda_call", "location"):
        if name in error and not isinstance(error[name], str):
            raise ProtocolError(f"error.{name} must be a string")
    return error


class _NodeDecoder:
    """Decodes result nodes, checking binary parts in strict depth-first order."""

    def __init__(self, parts: dict[str, memoryview]) -> None:
        self._parts = parts
        self._next_part = 0

    def finish(self) -> None:
        if self._next_part != len(self._parts):
            unused = sorted(set(self._parts) - {f"return:{i}" for i in range(self._next_part)})
            raise ProtocolError(f"binary parts not referenced by any result: {unused}")

    def decode(self, node: object, where: str) -> Any:
        if not isinstance(node, dict):
            raise ProtocolError(f"result {where!r}: a node must be an object")
        node_type = node.get("type")
        if not isinstance(node_type, str) or node_type not in NODE_FIELDS:
            raise ProtocolError(f"result {where!r}: unknown node type {node_type!r}")
        if set(node) != NODE_FIELDS[node_type]:
            raise ProtocolError(f"result {where!r}: wrong fields for a {node_type} node")
        value = node.get("value")
        if node_type == "null":
            return None
        if node_type == "boolean":
            return self._typed(value, bool, where)
        if node_type == "integer":
            if not _is_int(value):
                raise ProtocolError(f"result {where!r}: integer value must be an int")
            return value
        if node_type == "number":
            number = finite_float(value)
            if number is None:
                raise ProtocolError(f"result {where!r}: number value must be finite")
            return number
        if node_type == "string":
            return self._typed(value, str, where)
        if node_type == "array":
            items = self._typed(value, list, where)
            return [self.decode(item, f"{where}[{i}]") for i, item in enumerate(items)]
        if node_type == "object":
            members = self._typed(value, dict, where)
            decoded = {key: self.decode(item, f"{where}.{key}") for key, item in members.items()}
            return as_bench_result(decoded)  # a benchmark's dict renders (EXTENSIONS §12.5)
        if node_type == "bytes":
            return self._verified(node, where, bytes)
        if node_type == "tensor":
            return self._tensor(node, where)
        if node_type == "file":
            return self._file(node, where)
        return self._folder(node, where)

    @staticmethod
    def _typed(value: object, expected: type, where: str) -> Any:
        if not isinstance(value, expected):
            raise ProtocolError(f"result {where!r}: value must be {expected.__name__}")
        return value

    def _verified(self, node: dict[str, Any], where: str, convert: Callable[[memoryview], T]) -> T:
        """``convert(part)`` for the node's part, once its SHA-256 matched the node's.

        A large part is hashed while it is converted (the copy out of the response body),
        so the two passes overlap; a mismatch discards the converted value.
        """
        expected = f"return:{self._next_part}"
        if node["part"] != expected:
            raise ProtocolError(f"result {where!r}: part {node['part']!r}, expected {expected!r}")
        data = self._parts.get(expected)
        if data is None:
            raise ProtocolError(f"result {where!r}: part {expected!r} is missing")
        if data.nbytes < _PARALLEL_HASH_BYTES:
            digest = hashlib.sha256(data).hexdigest()
            if node["sha256"] == digest:  # else refused below, unconverted
                value = convert(data)
        else:
            digests: list[str] = []
            hasher = threading.Thread(
                target=lambda: digests.append(hashlib.sha256(data).hexdigest()),
                name="kcoral-part-hash",
                daemon=True,
            )
            hasher.start()
            try:
                value = convert(data)
            finally:
                hasher.join()
            if not digests:
                raise ProtocolError(f"result {where!r}: could not hash part {expected!r}")
            digest = digests[0]
        if node["sha256"] != digest:
            raise ProtocolError(f"result {where!r}: sha256 does not match part {expected!r}")
        self._next_part += 1
        return value

    def _tensor(self, node: dict[str, Any], where: str) -> np.ndarray:
        dtype = node["dtype"]
        shape = node["shape"]
        if not is_dtype(dtype):
            raise ProtocolError(f"result {where!r}: unknown tensor dtype {dtype!r}")
        if not isinstance(shape, list) or not all(_is_int(d) and d >= 0 for d in shape):
            raise ProtocolError(f"result {where!r}: tensor shape must be non-negative ints")
        if not numpy_can_hold(shape, numpy_dtype(dtype).itemsize):
            raise ProtocolError(
                f"result {where!r}: tensor shape {shape!r:.200} is beyond NumPy's limits"
            )
        length = byte_length(dtype, shape)

        def to_array(data: memoryview) -> np.ndarray | None:
            if data.nbytes != length:
                return None  # reported after the hash check, which comes first
            try:
                array: np.ndarray = np.frombuffer(data, dtype=numpy_dtype(dtype)).reshape(shape)
            except ValueError:  # a limit of this NumPy the check above does not know
                raise ProtocolError(
                    f"result {where!r}: tensor shape {shape!r:.200} is beyond NumPy's limits"
                ) from None
            # copy(): a writable array that owns its memory, independent of the response body
            copied: np.ndarray = array.copy()
            return copied

        array = self._verified(node, where, to_array)
        if array is None:
            raise ProtocolError(f"result {where!r}: tensor part has the wrong length")
        return array

    def _file(self, node: dict[str, Any], where: str) -> ReturnedFile:
        size = node["size"]
        if not _is_int(size) or size < 0:
            raise ProtocolError(f"result {where!r}: file size must be an integer >= 0")
        data = self._verified(
            node, where, lambda part: bytes(part) if part.nbytes == size else None
        )
        if data is None:
            raise ProtocolError(f"result {where!r}: file size {size} != part length")
        return ReturnedFile(data)

    def _folder(self, node: dict[str, Any], where: str) -> ReturnedFolder:
        files = node["files"]
        directories = node["directories"]
        if not isinstance(files, dict) or not isinstance(directories, list):
            raise ProtocolError(f"result {where!r}: folder needs a files object and a list")
        decoded: dict[str, ReturnedFile] = {}
        for path, file_node in files.items():
            if not isinstance(file_node, dict) or file_node.get("type") != "file":
                raise ProtocolError(f"result {where!r}: folder entry {path!r} is not a file")
            decoded[path] = self.decode(file_node, f"{where}/{path}")
        if not all(isinstance(d, str) for d in directories):
            raise ProtocolError(f"result {where!r}: folder directories must be strings")
        try:
            return ReturnedFolder(decoded, directories)
        except (TypeError, ValueError) as exc:
            raise ProtocolError(f"result {where!r}: invalid folder manifest: {exc}") from None


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
