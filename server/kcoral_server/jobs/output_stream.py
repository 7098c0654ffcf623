"""Live output of a running job: tail the capture files as the worker writes them.

The worker writes stdout/stderr at the file-descriptor level straight into the capture files
the front-end created (SERVER §9), so the front-end can follow them without any help from
the worker: poll their sizes every ``POLL_SECONDS``, read what was added (never past the
request's output limit) and emit it as text. Per stream at most one chunk per
``MIN_INTERVAL_SECONDS`` leaves (coalescing: ~20 events/s), and an incremental UTF-8
decoder keeps a multi-byte character that was cut by a write together. Before each phase
event the job catches up (``OutputTail.catch_up``): what the program wrote before it reached
that phase leaves first, so a reader never sees ``returning the results`` above the output
written before it. Output that has not left by a phase or the end leaves in the order the
program wrote it, by the worker's record (``OutputTail.runs``, EXTENSIONS §16). The final drain
decodes with ``final=True``, so the concatenated chunks equal what the response's
``stdout``/``stderr`` hold (the same bytes, decoded the same way, replacement included).
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path

POLL_SECONDS = 0.025
MIN_INTERVAL_SECONDS = 0.05
MAX_READ_BYTES = 4 << 20  # per poll and stream: one huge burst must not stall the loop

Emit = Callable[[str, str], None]  # (stream name, text)


class StreamTail:
    """One capture file followed from offset 0 up to ``limit`` bytes."""

    def __init__(self, name: str, path: Path, limit: int, emit: Emit) -> None:
        self.name = name
        self.path = path
        self.limit = limit
        self.emit = emit
        self.offset = 0
        self.last_emit = float("-inf")
        self._fd: int | None = None
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._done = False
        #: more was written than the limit lets out (the response's ``*_truncated``)
        self.truncated = False

    def poll(self, now: float, *, at_once: bool = False, upto: int | None = None) -> None:
        """Emit what was added, unless a chunk left less than the interval ago (``at_once``:
        whenever it left); ``upto``: nothing past that offset of the file."""
        if self._done or self.offset >= self.limit:
            return
        if not at_once and now - self.last_emit < MIN_INTERVAL_SECONDS:
            return
        data = self._read(MAX_READ_BYTES, upto)
        if data:
            self._send(self._decoder.decode(data), now)

    def drain(self) -> None:
        """Read everything left (within the limit), flush the decoder and stop: an event
        per ``MAX_READ_BYTES`` read, as while it ran, never the whole rest as one (up to
        an output limit of text in one ``data:`` line, for every reader to hold at once)."""
        if self._done:
            return
        now = time.monotonic()
        pending = ""
        while True:
            data = self._read(MAX_READ_BYTES)
            if not data:
                break
            self._send(pending, now)
            pending = self._decoder.decode(data)
        self._done = True
        self._send(pending + self._decoder.decode(b"", final=True), now)
        if self._fd is not None and self.offset >= self.limit:
            with contextlib.suppress(OSError):  # a trimmed capture keeps its true size
                self.truncated = os.fstat(self._fd).st_size > self.limit
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = None

    def _read(self, most: int, upto: int | None = None) -> bytes:
        if self.offset >= self.limit:
            return b""
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            size = os.fstat(self._fd).st_size
            if upto is not None:
                size = min(size, upto)
            want = min(size, self.limit) - self.offset
            if want <= 0:
                return b""
            data = os.pread(self._fd, min(want, most), self.offset)
        except OSError:
            return b""
        self.offset += len(data)
        return data

    def _send(self, text: str, now: float) -> None:
        if text:
            self.last_emit = now
            self.emit(self.name, text)


class OutputTail:
    """Both streams of one running program, polled by a task of the event loop."""

    def __init__(self, stdout: Path, stderr: Path, limit: int, emit: Emit) -> None:
        self.streams = [
            StreamTail("stdout", stdout, limit, emit),
            StreamTail("stderr", stderr, limit, emit),
        ]
        self._task: asyncio.Task | None = None
        #: the worker's record of how the two streams interleaved, in bytes (``(stream,
        #: end)``, EXTENSIONS §16): what has not left yet leaves in this order at a phase
        #: and at the end; a poll while the program runs cannot know it, and sends stdout
        #: before stderr
        self.runs: Sequence[tuple[int, int]] = ()

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._follow())

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(POLL_SECONDS)
            now = time.monotonic()
            for stream in self.streams:
                stream.poll(now)

    def catch_up(self, upto: tuple[int, int] | None = None) -> None:
        """Emit what both streams hold now, however recently a chunk left: called before a
        phase event, which must not overtake the output written before it (a cell's last
        line came after ``returning the results``). Only phases do this, so output stays
        coalesced while a program writes. ``upto``: the stdout and stderr sizes when the
        phase happened, when the worker said them: an instruction's frame is read while the
        program runs on, and the lines its instruction wrote must not precede its phase."""
        bounds = upto or (None, None)
        self._in_order(bounds)
        now = time.monotonic()
        for stream, bound in zip(self.streams, bounds, strict=True):
            stream.poll(now, at_once=True, upto=bound)

    def _in_order(self, bounds: tuple[int | None, int | None]) -> None:
        """Emit what ``runs`` cover, run by run, none past its stream's bound. (Each run's
        read is bounded by ``MAX_READ_BYTES``, as a poll's is; a drain reads the rest.)"""
        now = time.monotonic()
        for stream, end in self.runs:
            tail, bound = self.streams[stream - 1], bounds[stream - 1]
            if end > tail.offset:  # runs that already left cost nothing
                tail.poll(now, at_once=True, upto=end if bound is None else min(end, bound))

    async def finish(self) -> None:
        """Stop polling and emit the rest of both streams, in the order of ``runs``."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._in_order((None, None))
        for stream in self.streams:
            stream.drain()

    def close(self) -> None:
        """Stop without draining (the job is gone)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        for stream in self.streams:
            stream.close()
