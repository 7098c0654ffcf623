"""A minimal streaming HTTP/1.1 client for the node's own loopback server.

The tunnel needs backpressure in both directions and must never hold a whole body, which
Tornado's client cannot give for responses; this speaks just enough HTTP/1.1 for that.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

MAX_PIECE = 262144


class HttpError(Exception):
    """The server's answer could not be read as HTTP/1.1."""


class HttpConnection:
    def __init__(self, host: str, port: int, *, local_addr: tuple[str, int] | None = None) -> None:
        self.host = host
        self.port = port
        self.local_addr = local_addr
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.reusable = False

    async def open(self) -> None:
        self.reader, self.writer = await asyncio.open_connection(
            self.host, self.port, local_addr=self.local_addr, limit=1 << 17
        )
        self.reusable = True

    @property
    def usable(self) -> bool:
        return (
            self.reusable
            and self.writer is not None
            and not self.writer.is_closing()
            and self.reader is not None
            and not self.reader.at_eof()
        )

    def close(self) -> None:
        self.reusable = False
        if self.writer is not None:
            self.writer.close()
        self.reader = self.writer = None

    @property
    def _in(self) -> asyncio.StreamReader:
        if self.reader is None:
            raise HttpError("the connection is not open")
        return self.reader

    @property
    def _out(self) -> asyncio.StreamWriter:
        if self.writer is None:
            raise HttpError("the connection is not open")
        return self.writer

    async def send_head(self, method: str, path: str, headers: list[tuple[bytes, bytes]]) -> None:
        lines = [f"{method} {path} HTTP/1.1".encode()]
        lines.extend(name + b": " + value for name, value in headers)
        self._out.write(b"\r\n".join(lines) + b"\r\n\r\n")
        await self._out.drain()

    async def send(self, data: bytes | memoryview, *, chunked: bool) -> None:
        if chunked:
            if not data:
                return
            self._out.writelines([f"{len(data):x}\r\n".encode(), data, b"\r\n"])
        else:
            self._out.write(data)
        await self._out.drain()

    async def send_end(self, *, chunked: bool) -> None:
        if chunked:
            self._out.write(b"0\r\n\r\n")
            await self._out.drain()

    async def read_head(self) -> tuple[int, list[tuple[bytes, bytes]]]:
        line = await self._in.readline()
        parts = line.split(None, 2)
        if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
            raise HttpError(f"invalid status line {line[:80]!r}")
        status = int(parts[1])
        headers = []
        while True:
            line = await self._in.readline()
            if not line.endswith(b"\n"):
                raise HttpError("connection closed inside the response head")
            line = line.rstrip(b"\r\n")
            if not line:
                break
            name, sep, value = line.partition(b":")
            if not sep:
                raise HttpError("invalid header line")
            headers.append((name.strip(), value.strip()))
        return status, headers

    async def body(
        self, status: int, headers: list[tuple[bytes, bytes]], method: str = "POST"
    ) -> AsyncIterator[bytes]:
        """Yield the response body in pieces of at most ``MAX_PIECE`` bytes."""
        names = {name.lower(): value for name, value in headers}
        if b"close" in names.get(b"connection", b"").lower():
            self.reusable = False
        if method == "HEAD" or status in (204, 304) or 100 <= status < 200:
            return
        if b"chunked" in names.get(b"transfer-encoding", b"").lower():
            while True:
                size_line = await self._in.readline()
                try:
                    size = int(size_line.split(b";")[0].strip(), 16)
                except ValueError:
                    raise HttpError("invalid chunk size") from None
                if size == 0:
                    while (await self._in.readline()).strip():
                        pass  # trailers
                    return
                async for piece in self._exactly(size):
                    yield piece
                await self._in.readexactly(2)
        elif b"content-length" in names:
            async for piece in self._exactly(int(names[b"content-length"])):
                yield piece
        else:
            self.reusable = False
            while True:
                piece = await self._in.read(MAX_PIECE)
                if not piece:
                    return
                yield piece

    async def _exactly(self, count: int) -> AsyncIterator[bytes]:
        while count > 0:
            piece = await self._in.read(min(count, MAX_PIECE))
            if not piece:
                raise HttpError("connection closed inside the response body")
            count -= len(piece)
            yield piece


async def get(
    host: str,
    port: int,
    path: str,
    *,
    local_addr: tuple[str, int] | None = None,
    bearer: str | None = None,
    limit: int | None = None,
) -> tuple[int, bytes]:
    """One ``GET`` with ``Connection: close``; returns ``(status, body)``.

    ``bearer``: a secret to present as ``Authorization: Bearer`` (a node's child answers
    nothing without its router secret, ROUTER §12). ``limit``: the most body bytes read;
    ``HttpError`` beyond it."""
    connection = HttpConnection(host, port, local_addr=local_addr)
    await connection.open()
    try:
        hostname = f"[{host}]" if ":" in host else host
        head = [(b"Host", f"{hostname}:{port}".encode()), (b"Connection", b"close")]
        if bearer:
            head.append((b"Authorization", f"Bearer {bearer}".encode()))
        await connection.send_head("GET", path, head)
        status, headers = await connection.read_head()
        pieces, size = [], 0
        async for piece in connection.body(status, headers, "GET"):
            size += len(piece)
            if limit is not None and size > limit:
                raise HttpError(f"the answer is larger than {limit} bytes")
            pieces.append(piece)
    finally:
        connection.close()
    return status, b"".join(pieces)


async def get_json(
    host: str,
    port: int,
    path: str,
    *,
    local_addr: tuple[str, int] | None = None,
    bearer: str | None = None,
) -> tuple[int, Any]:
    """``get``, its body parsed as JSON (None when it is not JSON)."""
    status, data = await get(host, port, path, local_addr=local_addr, bearer=bearer)
    try:
        return status, json.loads(data)
    except ValueError:
        return status, None
