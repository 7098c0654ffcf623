"""Live output of a running job: tail the capture files as the worker writes them.

The worker writes stdout/stderr at the file-descriptor level straight into the capture files
the front-end created (SERVER §9), so the front-end can follow them without any help from
the worker: poll their sizes every ``POLL_SECONDS``, read what was added (never past the
request's output limit) and emit it as text. Per stream at most one chunk per
``MIN_INTERVAL_SECONDS`` leaves (coalescing: ~20 events/s), and an incremental UTF-8
decoder keeps a multi-byte character that was cut by a write together. Before each phase
event the job catches up (``OutputTail.catch_up``): what the program wrote before it reached
that phase leaves first, so a reader never sees ``returning the results`` above the output
written before it. The two streams leave in the order the program wrote them, by the
worker's record of each switch, read at each poll (``OutputTail``, EXTENSIONS §16). The final drain
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
from typing import Protocol

from kcoral.protocol.output_order import MAX_RUNS, STDERR, STDOUT, Run

POLL_SECONDS = 0.025
MIN_INTERVAL_SECONDS = 0.05
MAX_READ_BYTES = 4 << 20  # per poll and stream: one huge burst must not stall the loop
RUNS_PER_POLL = 256  # of the worker's record (EXTENSIONS §16): the rest at the next polls

Emit = Callable[[str, str], None]  # (stream name, text)


class RunRecord(Protocol):
    """Where the worker writes its runs as they happen (``progress_slot.ProgressSlot``)."""

    def runs_since(self, first: int, most: int) -> list[Run]: ...


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

    def size(self) -> int | None:
        """The file's size now (None: unreadable, as a read finds nothing)."""
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
            return os.fstat(self._fd).st_size
        except OSError:
            return None

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
    """Both streams of one running program, polled by a task of the event loop.

    The order of the two (EXTENSIONS §16): the worker writes each switch of stream into its
    progress slot as it happens (``record``), and a poll sends the runs that came since the
    last in that order, then the stream being written, then the other. Sizes are taken
    before the record is read, so no byte that followed a switch leaves before the switch
    is known. Without a record (no slot, or nothing but one stream written yet) a poll sends
    stdout, then stderr. The record is the program's to spoil: it only orders bytes read from
    the capture files (never more than they hold, every byte once), a run claiming bytes the
    file still lacks at the next poll drops the record for this program, and the runs read
    are at most ``MAX_RUNS`` in all, ``RUNS_PER_POLL`` at a time.
    """

    def __init__(self, stdout: Path, stderr: Path, limit: int, emit: Emit) -> None:
        self.streams = [
            StreamTail("stdout", stdout, limit, emit),
            StreamTail("stderr", stderr, limit, emit),
        ]
        self._task: asyncio.Task | None = None
        #: the worker's record of how the two streams interleaved, in bytes (``(stream,
        #: end)``, EXTENSIONS §16) as its last ``OutputOrder`` frame said: what has not left
        #: yet leaves in this order at a phase and at the end
        self.runs: Sequence[tuple[int, int]] = ()
        #: the worker's progress slot, holding the same runs as they happen (``Job``)
        self.record: RunRecord | None = None
        self._record_read = 0  # runs of ``record`` already sent
        self._blocked_at = -1  # the run a poll stopped at, for lack of its bytes
        self._writing: int | None = None  # the stream after the last run (1, 2: stdout, stderr)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.ensure_future(self._follow())

    async def _follow(self) -> None:
        while True:
            await asyncio.sleep(POLL_SECONDS)
            self._poll(time.monotonic())

    def _poll(self, now: float) -> None:
        # sizes first: a byte they count that followed a switch has its run in the record
        bounds = self._sizes()
        if self._writing is None and not self._record_has_runs():
            for stream, bound in zip(self.streams, bounds, strict=True):
                stream.poll(now, upto=bound)  # no order known: stdout, then stderr
            return
        if now - max(stream.last_emit for stream in self.streams) < MIN_INTERVAL_SECONDS:
            return  # coalesced as a stream alone is: ~20 batches/s
        if self._in_order(now, bounds, RUNS_PER_POLL, polling=True):
            # (else what follows a run not sent whole waits: the two sizes are not taken
            # at one instant, so the other stream may hold bytes written after it)
            self._rest(now, bounds)

    def catch_up(self, upto: tuple[int, int] | None = None) -> None:
        """Emit what both streams hold now, however recently a chunk left: called before a
        phase event, which must not overtake the output written before it (a cell's last
        line came after ``returning the results``). Only phases do this, so output stays
        coalesced while a program writes. ``upto``: the stdout and stderr sizes when the
        phase happened, when the worker said them: an instruction's frame is read while the
        program runs on, and the lines its instruction wrote must not precede its phase."""
        bounds = upto or self._sizes()
        self._all_in_order(bounds)
        self._rest(time.monotonic(), bounds)  # all written before the phase, whatever run

    def _record_has_runs(self) -> bool:
        return self.record is not None and bool(self.record.runs_since(self._record_read, 1))

    def _sizes(self) -> tuple[int | None, int | None]:
        first, second = (stream.size() for stream in self.streams)
        return first, second

    def _in_order(
        self, now: float, bounds: tuple[int | None, int | None], most: int, *, polling: bool
    ) -> bool:
        """Emit the runs not sent yet, of the record then of the last frame, in order, none
        past its stream's bound; False where a run goes past it (what follows that run
        waits). ``polling``: the bounds are the sizes now, which an honest run never
        passes at the poll after it was written."""
        if self.record is not None:
            for stream, end in self.record.runs_since(self._record_read, most):
                bound = bounds[stream - 1]
                if polling and bound is not None and end > bound:
                    if self._blocked_at == self._record_read:  # and was at the last poll
                        self.record, self._writing = None, None  # spoiled: claims bytes
                        return True
                    self._blocked_at = self._record_read
                if not self._emit_run(now, stream, end, bounds):
                    return False
                self._record_read += 1
                self._writing = STDERR if stream == STDOUT else STDOUT
            if self.record.runs_since(self._record_read, 1):
                return False  # more than ``most``: the next poll goes on
        for stream, end in self.runs:
            if not self._emit_run(now, stream, end, bounds):
                return False
        return True

    def _all_in_order(self, bounds: tuple[int | None, int | None]) -> None:
        """``_in_order`` of every run, none past ``bounds``: a run longer than one read
        (``MAX_READ_BYTES``) stops short, so read on until the runs are sent or a read moves
        nothing (a bound reached, or a run claiming bytes its file lacks). Only at a phase
        and at the end, before which all that was written must leave."""
        while True:
            before = [stream.offset for stream in self.streams]
            if self._in_order(time.monotonic(), bounds, MAX_RUNS, polling=False):
                return
            if [stream.offset for stream in self.streams] == before:
                return

    def _emit_run(
        self, now: float, stream: int, end: int, bounds: tuple[int | None, int | None]
    ) -> bool:
        """Emit ``stream`` up to ``end``; False when its bound or one read stopped short."""
        tail, bound = self.streams[stream - 1], bounds[stream - 1]
        if bound is not None and end > bound:
            tail.poll(now, at_once=True, upto=bound)
            return False
        if end > tail.offset:  # runs that already left cost nothing
            tail.poll(now, at_once=True, upto=end)
        return tail.offset >= min(end, tail.limit)

    def _rest(self, now: float, bounds: tuple[int | None, int | None]) -> None:
        """Emit what no run covers yet: the stream being written first."""
        for index in self._stream_order():
            self.streams[index].poll(now, at_once=True, upto=bounds[index])

    def _stream_order(self) -> tuple[int, int]:
        return (1, 0) if self._writing == STDERR else (0, 1)

    async def finish(self) -> None:
        """Stop polling and emit the rest of both streams, in the order of the runs."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        self._all_in_order((None, None))
        for index in self._stream_order():
            self.streams[index].drain()

    def close(self) -> None:
        """Stop without draining (the job is gone)."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        for stream in self.streams:
            stream.close()
