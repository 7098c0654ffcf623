"""The client's real HTTP transport noting each request it is handed, and a program whose
one upload is a body of a chosen size: what a test of the client's pre-send size check
(CLIENT_API §2.1 step 11) needs, against a server or a router."""

from __future__ import annotations

from kcoral import Program
from kcoral.connection.http import HttpTransport
from kcoral.connection.transport import Request, Response


class Recording:
    """The real HTTP transport, noting each request it is handed."""

    def __init__(self, inner: HttpTransport) -> None:
        self.inner = inner
        self.sent: list[tuple[str, str, int]] = []

    def handle_request(self, request: Request) -> Response:
        self.sent.append((request.method, request.path, request.length))
        return self.inner.handle_request(request)

    def close(self) -> None:
        self.inner.close()


def program_of(size: int, data: bytes) -> Program:
    """A program uploading ``data[:size]`` and returning its length as ``size``."""
    program = Program()
    blob = program.upload(kind="bytes", value=data[:size])
    module = program.upload(kind="module", source="def size(b):\n    return len(b)\n")
    function = program.get_function(module=module, name="size")
    program.return_(key="size", value=program.run(fn=function, args=[blob]))
    return program
