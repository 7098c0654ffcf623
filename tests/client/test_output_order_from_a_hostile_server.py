"""A server's ``output_order`` is a hint, never a way to lose or break output (EXTENSIONS
§16): a hostile or broken server that sends ends past the texts, negative or backwards
ones, a million runs or no list at all gets every character of stdout and stderr shown
exactly once, and the client never raises over it. A published server, which sends none,
reads as before: stdout, then stderr.

The server is a stand-in on loopback that answers ``/execute`` with the record under test.
"""

from __future__ import annotations

import http.server
import json
from typing import Any, ClassVar

import pytest
from stand_in_http import serving

from kcoral import Client, Program
from kcoral.protocol.output_order import interleave

STDOUT = "a\nb\nc\n"
STDERR = "warn: é\n"

BOGUS_RECORDS: dict[str, Any] = {
    "ends far past the texts": [[1, 10**12], [2, 10**15], [1, 2**80]],
    "negative ends": [[1, -5], [2, -1], [1, -(2**70)]],
    "ends going backwards": [[1, 6], [2, 3], [1, 2], [2, 1], [1, 0]],
    "a million runs": [[1, 1], [2, 1]] * 500_000,
    "no list": {"runs": [[1, 2]]},
    "a string": "1,2;2,5",
    "null": None,
    "an unknown stream": [[3, 2], [1, 2]],
    "a stream that is a bool": [[True, 2], [2, 1]],
    "an end that is a float": [[1, 2.5], [2, 1]],
    "an end that is a string": [[1, "2"], [2, 1]],
    "runs of three": [[1, 2, 3]],
    "a run that is an object": [{"stream": 1, "end": 2}],
    "nested deep": [[[[[[1]]]]]],
}


class RecordingServer(http.server.BaseHTTPRequestHandler):
    """Answers every ``/execute`` as a COMPLETED program with ``record`` as its order."""

    record: ClassVar[Any] = None
    send_record: ClassVar[bool] = True
    headers_seen: ClassVar[list[dict[str, str]]] = []

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        type(self).headers_seen.append(dict(self.headers))
        document: dict[str, Any] = {
            "status": "COMPLETED",
            "request_id": "r-1",
            "queue_ms": 0.0,
            "elapsed_ms": 1.0,
            "lease_wait_ms": 0.0,
            "lease_held_ms": 0.0,
            "stdout": STDOUT,
            "stderr": STDERR,
            "stdout_truncated": False,
            "stderr_truncated": False,
            "results": {},
        }
        if self.send_record:
            document["output_order"] = self.record
        body = json.dumps(document).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass


def _program() -> Program:
    program = Program()
    module = program.upload(kind="module", source="def f():\n    return 1\n")
    program.run(fn=program.get_function(module=module, name="f"))
    return program


def _joined(pieces: list[tuple[str, str]], stream: str) -> str:
    return "".join(text for name, text in pieces if name == stream)


@pytest.mark.parametrize("name", sorted(BOGUS_RECORDS))
def test_a_bogus_order_record_loses_no_text_and_raises_nothing(name: str) -> None:
    RecordingServer.record = BOGUS_RECORDS[name]
    RecordingServer.send_record = True
    with serving(RecordingServer) as url, Client(url) as client:
        result = client.execute(_program())
    pieces = result.output_in_order()
    assert (_joined(pieces, "stdout"), _joined(pieces, "stderr")) == (STDOUT, STDERR)
    assert (result.stdout, result.stderr) == (STDOUT, STDERR)


def test_a_published_server_without_a_record_shows_stdout_then_stderr() -> None:
    RecordingServer.send_record = False
    RecordingServer.headers_seen = []
    with serving(RecordingServer) as url, Client(url) as client:
        result = client.execute(_program())
    assert result.output_order == ()
    assert result.output_in_order() == [("stdout", STDOUT), ("stderr", STDERR)]
    # the client asked; a server that does not know the header answers as it always did
    assert RecordingServer.headers_seen[-1].get("X-KCoral-Output-Order") == "1"


def test_a_good_record_interleaves_by_characters() -> None:
    RecordingServer.record = [[1, 2], [2, 8], [1, 6]]
    RecordingServer.send_record = True
    with serving(RecordingServer) as url, Client(url) as client:
        result = client.execute(_program())
    assert result.output_in_order() == [
        ("stdout", "a\n"),
        ("stderr", STDERR),
        ("stdout", "b\nc\n"),
    ]


def test_runs_that_go_back_or_past_a_text_show_each_character_once() -> None:
    runs = ((2, 3), (1, 1), (2, 1), (1, 99), (2, 2))
    assert interleave("xyz", "uvwq", runs) == [
        ("stderr", "uvw"),
        ("stdout", "xyz"),
        ("stderr", "q"),
    ]


class _CountingText(str):
    """A text that counts the characters its joins by ``+`` copy (``copied``)."""

    copied: ClassVar[list[int]] = [0]

    def __getitem__(self, key: Any) -> _CountingText:
        return _CountingText(str.__getitem__(self, key))

    def __add__(self, other: str) -> _CountingText:
        _CountingText.copied[0] += len(self) + len(other)
        return _CountingText(str.__add__(self, other))


def test_ten_thousand_runs_of_one_stream_copy_its_text_once_not_once_a_run() -> None:
    # a malicious server's record of 10,000 runs of stdout over its whole text: each run
    # joined to the piece before made a 16 MiB stdout cost 46 s of the client's CPU
    stdout = _CountingText("x" * 100_000)
    runs = tuple((1, (index + 1) * 10) for index in range(10_000))
    _CountingText.copied[0] = 0
    pieces = interleave(stdout, "warn\n", runs)
    assert pieces == [("stdout", stdout), ("stderr", "warn\n")]
    assert _CountingText.copied[0] <= len(stdout)
