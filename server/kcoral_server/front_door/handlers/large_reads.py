"""Large request bodies read in large rounds: the one place the server reaches into
Tornado's HTTP/1.1 connection.

Tornado reads a body in rounds of its ``chunk_size`` (64 KiB) and its stream's
``read_chunk_size``: each round costs a syscall, a buffer and a few Python calls (1,024 of
them for 64 MiB). Tornado offers no per-request setting for either, so for a body that
declares at least ``LARGE_BODY_CHUNK`` bytes this module gives the connection its own copy
of the parameters (the original is shared by every connection of the server) with a larger
chunk, and sets the stream's read size until ``restore``. A connection without these
private attributes (another Tornado, another transport) is left alone: bodies then arrive
in small rounds, which is slower, not wrong.

Each round is also read straight from the socket into one buffer the request reuses
(``IOStream.read_into``) instead of Tornado's own path, which reads into a fresh 1 MiB
``bytearray``, appends it to the stream's buffer and slices a ``bytes`` off that: two copies
of every body byte and a fresh allocation per round, before ``data_received`` copies the
round into the body's memfd anyway. The round handed to ``data_received`` is a view of the
reused buffer, valid during the call only (``RequestBody.write`` copies it at once).
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

LARGE_BODY_CHUNK = 1 << 20


class LargeReads:
    """Switch one request's connection to ``LARGE_BODY_CHUNK`` rounds, and back."""

    def __init__(self, connection: Any) -> None:
        self._connection = connection
        self._small: int | None = None  # the stream's own read size, while reading large

    def start(self) -> None:
        connection = self._connection
        stream = getattr(connection, "stream", None)
        params = getattr(connection, "params", None)
        if stream is None or params is None or not hasattr(stream, "read_chunk_size"):
            return
        params = copy.copy(params)  # the server's object is shared by every connection
        params.chunk_size = LARGE_BODY_CHUNK
        connection.params = params
        self._small = stream.read_chunk_size
        stream.read_chunk_size = LARGE_BODY_CHUNK
        if hasattr(stream, "read_into") and hasattr(connection, "_deliver_body"):
            # an attribute of this connection only, read by Tornado when the body starts
            connection._read_fixed_body = self._read_fixed_body

    async def _read_fixed_body(self, content_length: int, delegate: Any) -> None:
        """Tornado's ``HTTP1Connection._read_fixed_body`` (same rounds, same delivery, a
        yield to the loop after each round), reading into one reused buffer."""
        connection = self._connection
        buffer = memoryview(bytearray(min(LARGE_BODY_CHUNK, content_length)))
        try:
            while content_length > 0:
                window = buffer[: min(len(buffer), content_length)]
                got = await connection.stream.read_into(window, partial=True)
                content_length -= got
                await connection._deliver_body(delegate, buffer[:got])
                await asyncio.sleep(0)
        finally:
            del connection._read_fixed_body  # later requests on the connection: Tornado's

    def restore(self) -> None:
        """Later small requests on this keep-alive connection read in small rounds again
        (the parameters copy stays: ``chunk_size`` only matters while a body is read)."""
        if self._small is not None:
            self._connection.stream.read_chunk_size = self._small
            self._small = None
