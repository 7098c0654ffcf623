"""A malicious KCoral server that answers more than the client's machine holds.

Under Linux's overcommit a growing buffer never fails its allocation: a client that reads
whatever comes grows until the OOM killer ends it (a notebook kernel, with every variable
in it). The attacker is a real HTTP server on loopback that declares a huge
``Content-Length``, or streams chunks without end; the client is a real ``Client`` in a
child process whose address space is limited (``RLIMIT_AS``), so the test itself never
holds the answer. It must give up early with a ``TransportError`` naming the size, the
bound and the setting (EXTENSIONS §17), while an answer under the bound still comes back.
"""

from __future__ import annotations

import http.server
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest
from stand_in_http import serving

from kcoral import Client

pytestmark = pytest.mark.timeout(120)

MIB = 1 << 20
GIB = 1 << 30
#: the child's address space: more than Python with kcoral needs, far less than the attack
CHILD_ADDRESS_SPACE = 2 * GIB
#: what the server may have written before the client gave up (socket buffers included)
GIVEN_UP_EARLY = 256 * MIB

_CLIENT = """
import resource, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[3]), int(sys.argv[3])))
from kcoral import Client
from kcoral.errors import TransportError
bound = int(sys.argv[2])
try:
    Client(sys.argv[1], **({"max_answer_bytes": bound} if bound else {})).info()
except TransportError as exc:
    print(exc)
    sys.exit(0)
print("the client took the whole answer")
sys.exit(1)
"""


class _Flood(http.server.BaseHTTPRequestHandler):
    """Answers every GET with zeros until the client hangs up: ``declared`` bytes under a
    ``Content-Length``, or chunks without end when ``declared`` is 0."""

    protocol_version = "HTTP/1.1"
    declared = 0
    sent = 0
    hung_up = threading.Event()

    def do_GET(self) -> None:
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        if self.declared:
            self.send_header("Content-Length", str(self.declared))
        else:
            self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        piece = bytes(MIB)
        chunk = b"%x\r\n%s\r\n" % (len(piece), piece)
        try:
            while type(self).sent < (self.declared or 1 << 62):
                self.wfile.write(piece if self.declared else chunk)
                type(self).sent += len(piece)
        except OSError:
            pass
        finally:
            self.close_connection = True
            type(self).hung_up.set()

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def flood() -> Iterator[type[_Flood]]:
    handler = type("Flood", (_Flood,), {"sent": 0, "hung_up": threading.Event()})
    with serving(handler) as url:
        handler.url = url  # type: ignore[attr-defined]
        yield handler


def client_against(url: str, max_answer_bytes: int | None) -> str:
    """What a real client in a memory-limited child says of ``url``'s answer."""
    child = subprocess.run(
        [sys.executable, "-c", _CLIENT, url, str(max_answer_bytes or 0), str(CHILD_ADDRESS_SPACE)],
        capture_output=True,
        text=True,
        timeout=100,
    )
    assert child.returncode == 0, child.stdout + child.stderr
    return child.stdout.strip()


def test_an_answer_declared_larger_than_any_machine_holds_is_refused_before_its_body(
    flood,
) -> None:
    flood.declared = 1 << 40
    said = client_against(flood.url, None)
    assert flood.hung_up.wait(30)
    assert flood.sent < GIVEN_UP_EARLY, f"the client read {flood.sent >> 20} MiB first"
    assert "its answer is 1.0 TiB, more than the " in said
    assert "pass max_answer_bytes= to the client, or set KCORAL_MAX_ANSWER_BYTES" in said


def test_an_answer_declared_over_max_answer_bytes_is_refused_before_its_body(flood) -> None:
    flood.declared = 8 * GIB
    said = client_against(flood.url, GIB)
    assert flood.hung_up.wait(30)
    assert flood.sent < GIVEN_UP_EARLY, f"the client read {flood.sent >> 20} MiB first"
    assert said.endswith(
        "answered, but its answer is 8.0 GiB, more than the 1.0 GiB this client reads "
        "(its max_answer_bytes): pass max_answer_bytes= to the client, or set "
        "KCORAL_MAX_ANSWER_BYTES, to read more"
    )


def test_an_endless_chunked_answer_is_cut_once_it_passes_max_answer_bytes(flood) -> None:
    said = client_against(flood.url, 64 * MIB)
    assert flood.hung_up.wait(30)
    assert flood.sent < GIVEN_UP_EARLY, f"the client read {flood.sent >> 20} MiB first"
    assert "answered, but its answer passed 65.0 MiB, more than the 64.0 MiB" in said


def test_an_answer_under_the_bound_still_comes_back_whole() -> None:
    body = b'{"padding": "' + b"x" * (96 * MIB) + b'"}'

    class _Large(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with serving(_Large) as url:
        info = Client(url, max_answer_bytes=len(body)).info()
    assert len(info["padding"]) == 96 * MIB
