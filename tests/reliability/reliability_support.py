"""Raw HTTP, hand-made multipart bodies, the response oracle and resource accounting.

The reliability suite talks to real servers byte by byte (no ``kcoral.Client``), so it can
send what no well-behaved client would. Every answer goes through ``check_documented``: a
status of PROTOCOL.md §7.1 with the exact ``ERROR`` body of §7.4, or a 200 body of §7.2/§7.3.
Resource accounting counts what a front-end could leak: its open descriptors (memfds
included), its descendant processes, and ``kcoral-program-*`` workspaces in its ``TMPDIR``.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from raw_http import call_program, decode_body, sha256
from server_process import start_server
from waiting import wait_until

from kcoral.protocol.headers import is_canonical_uuid

BOUNDARY = "fuzz-boundary-7d1c"
ERROR_STATUSES = {
    400: {"parse"},
    401: {"unauthorized"},
    404: {"not_found"},
    405: {"method_not_allowed"},
    413: {"request_too_large"},
    500: {"engine", "response_too_large"},
    503: {"busy"},
    504: {"timeout"},
}
ENGINE_MESSAGES = {
    "worker crashed",
    "invalid worker response",
    "worker cleanup was not confirmed; affected devices unavailable",
}


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    raw: bytes
    body: Any = None
    parts: dict[str, bytes] = field(default_factory=dict)


def address(url: str) -> tuple[str, int]:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    return host.strip("[]"), int(port)


def decode(status: int, headers: Iterable[tuple[str, str]], raw: bytes) -> Answer:
    lowered = {name.lower(): value for name, value in headers}
    answer = Answer(status, lowered, raw)
    decoded = decode_body(lowered.get("content-type", ""), raw)
    answer.body, answer.parts = decoded.body, decoded.parts
    return answer


#: Requests ``exchange`` has sent in this process (the fuzz suite reports its share).
REQUESTS_SENT = [0]


def exchange(url: str, data: bytes, timeout: float = 60.0) -> Answer:
    """Send ``data`` (a whole HTTP request, possibly malformed) and read one response."""
    REQUESTS_SENT[0] += 1
    with socket.create_connection(address(url), timeout=timeout) as sock:
        sock.sendall(data)
        response = http.client.HTTPResponse(sock)
        response.begin()
        raw = response.read()
        return decode(response.status, response.getheaders(), raw)


def request_bytes(
    method: str,
    path: str,
    body: bytes | None,
    headers: list[tuple[str, str]] | None = None,
    *,
    content_length: bool = True,
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Connection: close"]
    lines += [f"{name}: {value}" for name, value in headers or []]
    if body is not None and content_length:
        lines.append(f"Content-Length: {len(body)}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")
    return head + (body or b"")


def post_execute(
    url: str,
    body: bytes,
    content_type: str | None = None,
    headers: list[tuple[str, str]] | None = None,
    timeout: float = 60.0,
) -> Answer:
    all_headers = list(headers or [])
    if content_type is not None:
        all_headers.insert(0, ("Content-Type", content_type))
    return exchange(url, request_bytes("POST", "/execute", body, all_headers), timeout)


def get(url: str, path: str, headers: list[tuple[str, str]] | None = None) -> Answer:
    return exchange(url, request_bytes("GET", path, None, headers))


FUZZ_EXAMPLES = int(os.environ.get("KCORAL_FUZZ_EXAMPLES", "0") or 0)


def fuzz_examples(default: int) -> int:
    """``max_examples`` for one fuzz property (``KCORAL_FUZZ_EXAMPLES`` overrides all)."""
    return FUZZ_EXAMPLES or default


# ------------------------------------------------------------------ servers


@dataclass
class Launched:
    """A ``kcoral server`` subprocess with its own ``TMPDIR`` (for counting workspaces)."""

    url: str
    process: subprocess.Popen
    directory: Path
    temp_dir: Path
    baseline: Resources | None = None

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def disk_cache_dir(self) -> Path:
        return self.directory / "disk-cache"

    @property
    def log_dir(self) -> Path:
        return self.directory / "logs"

    def stderr(self) -> str:
        return (self.directory / "server.stderr").read_text(errors="replace")

    def events(self) -> list[dict]:
        records = []
        for path in sorted(self.log_dir.glob("runs/*/events.jsonl")):
            records += [json.loads(line) for line in path.read_text().splitlines() if line]
        return records

    def stop(self, sig: int = signal.SIGTERM) -> None:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


def launch(
    directory: Path, args: Iterable[str] = (), env: dict[str, str] | None = None
) -> Launched:
    """Start a server with the suite's defaults (``server_process.start_server``'s) and its
    own ``TMPDIR``, and wait until it listens."""
    temp_dir = directory / "tmp"
    temp_dir.mkdir(parents=True, exist_ok=True)
    started = start_server(directory, list(args), env={"TMPDIR": str(temp_dir), **(env or {})})
    _STATUS_LINES[started.process.pid] = StatusLine(started.url)
    return Launched(started.url, started.process, directory, temp_dir)


def warm(server: Launched) -> Launched:
    """One request through every worker path, then the settled resource baseline."""
    check_healthy(server.url)
    first = measure(server.pid, server.temp_dir)
    server.baseline = settle(server.pid, server.temp_dir, first, timeout=5.0)
    return server


# ------------------------------------------------------------------ request bodies


def part(
    name: str | None, content_type: str | None, data: bytes, extra: Iterable[str] = ()
) -> bytes:
    """One part with CRLF headers (``None`` leaves a header out)."""
    lines = []
    if name is not None:
        lines.append(f'Content-Disposition: form-data; name="{name}"')
    if content_type is not None:
        lines.append(f"Content-Type: {content_type}")
    lines += list(extra)
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + data


def framed(parts: Iterable[bytes], boundary: str = BOUNDARY, *, close: bool = True) -> bytes:
    delimiter = f"--{boundary}".encode()
    body = b"".join(delimiter + b"\r\n" + p + b"\r\n" for p in parts)
    return body + (delimiter + b"--\r\n" if close else b"")


def program_part(program: Any) -> bytes:
    data = program if isinstance(program, bytes) else json.dumps(program).encode()
    return part("program", "application/json", data)


def blob_part(data: bytes, name: str | None = None) -> bytes:
    return part(name or f"blob:{sha256(data)}", "application/octet-stream", data)


def execute_body(program: Any, blobs: Iterable[bytes] = ()) -> bytes:
    return framed([program_part(program), *(blob_part(b) for b in blobs)])


def multipart_type(boundary: str = BOUNDARY) -> str:
    return f"multipart/form-data; boundary={boundary}"


def execute(url: str, program: Any, blobs: Iterable[bytes] = (), **kwargs: Any) -> Answer:
    return post_execute(url, execute_body(program, blobs), multipart_type(), **kwargs)


#: Upload ``source``, call ``function(*args)`` and return the value under ``"value"``.
module_program = call_program


TRIVIAL = module_program("def f(x):\n    return x + 1\n", "f", [41])


# ------------------------------------------------------------------ the oracle


def check_documented(answer: Answer) -> None:
    """Every answer to ``/execute``: a documented status, exact body, matching request id."""
    request_id = answer.headers.get("x-request-id")
    assert is_canonical_uuid(request_id), answer.headers
    body = answer.body
    assert isinstance(body, dict), (answer.status, answer.raw[:300])
    assert body.get("request_id") == request_id
    if answer.status == 200:
        assert body["status"] in ("COMPLETED", "FAILED", "CACHE_MISS"), body
        if body["status"] == "CACHE_MISS":
            assert set(body) == {"status", "request_id", "missing_blobs"}
            assert body["missing_blobs"] and len(set(body["missing_blobs"])) == len(
                body["missing_blobs"]
            )
        return
    assert answer.status in ERROR_STATUSES, (answer.status, body)
    assert set(body) == {"status", "request_id", "error"}, body
    assert body["status"] == "ERROR"
    error = body["error"]
    assert set(error) == {"kind", "message"} and isinstance(error["message"], str), body
    assert error["kind"] in ERROR_STATUSES[answer.status], (answer.status, body)
    if answer.status == 500 and error["kind"] == "engine":
        # "internal server error" is an unhandled front-end fault: never acceptable here.
        # "worker crashed" may say how after a colon (SERVER §8: a limit, a signal, a status)
        assert error["message"].split(": ", 1)[0] in ENGINE_MESSAGES, body
    if answer.status == 503:
        assert answer.headers.get("retry-after") == "1"


def check_error(answer: Answer, status: int, kind: str) -> None:
    check_documented(answer)
    assert (answer.status, answer.body["error"]["kind"]) == (status, kind), answer.body


def check_healthy(url: str) -> None:
    """``/health`` answers ``ok`` and a trivial program still completes."""
    health = get(url, "/health")
    assert health.status == 200 and health.body["status"] == "ok", health.body
    answer = execute(url, TRIVIAL)
    check_documented(answer)
    assert answer.body["status"] == "COMPLETED", answer.body
    assert answer.body["results"] == {"value": {"type": "integer", "value": 42}}


# ------------------------------------------------------------------ resources


@dataclass(frozen=True)
class Resources:
    fds: int
    processes: int
    workspaces: int
    rss_bytes: int


def children(pid: int) -> list[int]:
    found = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            found += [int(p) for p in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return found


def descendants(pid: int) -> list[int]:
    seen: list[int] = []
    pending = [pid]
    while pending:
        for child in children(pending.pop()):
            if child not in seen and is_alive(child):
                seen.append(child)
                pending.append(child)
    return seen


def is_alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def rss_bytes(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def workspaces(temp_dir: Path) -> list[Path]:
    return sorted(temp_dir.glob("kcoral-program-*"))


def cache_descriptors(url: str) -> int:
    """Descriptors the server's memory cache keeps open on purpose (PROTOCOL §13): large
    blobs cached as views of their request bodies. 0 when the server cannot say."""
    return _held_in(get(url, "/internal/worker-status"))


def _held_in(answer: Answer) -> int:
    body = answer.body if answer.status == 200 and isinstance(answer.body, dict) else {}
    held = body.get("cache_descriptors", 0)
    return held if type(held) is int and held >= 0 else 0


class StatusLine:
    """One kept-alive connection to a server's ``/internal/worker-status`` for ``measure``.
    Open at every count, it is the same one descriptor of the front-end each time; a new
    connection per query would be closed by the client just before the next count, and the
    front-end's end of it may not be closed yet (one descriptor more, now and then)."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.connection: http.client.HTTPConnection | None = None

    def cache_descriptors(self) -> int:
        for _ in range(2):  # a connection the server closed while idle: once more, anew
            try:
                if self.connection is None:
                    self.connection = http.client.HTTPConnection(*address(self.url), timeout=30)
                self.connection.request("GET", "/internal/worker-status")
                response = self.connection.getresponse()
                raw = response.read()
                return _held_in(decode(response.status, response.getheaders(), raw))
            except (OSError, http.client.HTTPException):
                if self.connection is not None:
                    self.connection.close()
                self.connection = None
        return 0


# pid -> the status line of every server ``launch`` started (``measure`` asks it)
_STATUS_LINES: dict[int, StatusLine] = {}


def measure(pid: int, temp_dir: Path) -> Resources:
    """What the front-end holds. Its open descriptors exclude those its memory cache holds
    on purpose (the server counts them by cache entry: any other descriptor, a body memfd
    that no entry names included, still counts as a leak)."""
    line = _STATUS_LINES.get(pid)
    held = line.cache_descriptors() if line is not None else 0  # asked before counting
    try:
        fds = len(os.listdir(f"/proc/{pid}/fd")) - held
    except OSError:
        fds = -1
    return Resources(fds, len(descendants(pid)), len(workspaces(temp_dir)), rss_bytes(pid))


def settle(pid: int, temp_dir: Path, baseline: Resources, timeout: float = 30.0) -> Resources:
    """Wait until nothing exceeds ``baseline`` (replacement workers start in the background);
    return the last measurement, which the caller asserts on."""
    last = measure(pid, temp_dir)

    def settled() -> bool:
        nonlocal last
        last = measure(pid, temp_dir)
        return (
            last.fds <= baseline.fds
            and last.processes == baseline.processes
            and last.workspaces == 0
        )

    wait_until(settled, timeout)
    return last


def assert_no_leaks(pid: int, temp_dir: Path, baseline: Resources) -> None:
    after = settle(pid, temp_dir, baseline)
    assert after.fds <= baseline.fds, f"descriptors leaked: {baseline} -> {after}"
    assert after.processes == baseline.processes, f"processes leaked: {baseline} -> {after}"
    assert after.workspaces == 0, f"workspaces leaked: {workspaces(temp_dir)}"
