"""A bare Tornado echo server: the HTTP floor that KCoral round trips are compared with.

    python benchmarks/perf_echo_server.py READY_FILE

``POST /echo`` answers with the request body; the URL is written to ``READY_FILE`` once the
socket listens. Nothing else runs in the process, so the round trip is pure HTTP + Tornado.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import tornado.web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets


class EchoHandler(tornado.web.RequestHandler):
    def post(self) -> None:
        self.set_header("Content-Type", "application/octet-stream")
        self.write(self.request.body)


async def serve(ready_file: Path) -> None:
    app = tornado.web.Application([(r"/echo", EchoHandler)])
    sockets = bind_sockets(0, "127.0.0.1")
    server = HTTPServer(app, max_body_size=1 << 30)
    server.add_sockets(sockets)
    port = sockets[0].getsockname()[1]
    ready_file.write_text(f"http://127.0.0.1:{port}")
    await asyncio.Event().wait()  # until the harness terminates us


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1].startswith("-"):
        # ``--help`` was taken for the ready file's name: a file "--help" in the caller's folder
        sys.exit("usage: python benchmarks/perf_echo_server.py READY_FILE (perf.py runs it)")
    asyncio.run(serve(Path(sys.argv[1])))
