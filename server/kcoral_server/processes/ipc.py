"""Typed, versioned messages between the front-end and a worker process.

Transport: a connected ``AF_UNIX`` stream socket. A frame is a 4-byte big-endian length plus a
compact JSON object ``{"t": <tag>, "v": IPC_VERSION, ...fields}``; file descriptors (memfds
holding blobs or encoded results) ride along as ``SCM_RIGHTS`` ancillary data on the first
``sendmsg`` of their frame, and the frame says how many it carries (``fd_count``).

JSON rather than pickle: the worker runs uploaded code, so nothing the front-end reads from it
may be able to execute code on the front-end. Large bytes never travel inside frames.

Each worker also shares a ``progress_slot.ProgressSlot`` with the front-end (the instruction it
started last); only a program followed live sends ``InstructionStarted`` frames.
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import json
import os
import select
import socket
import struct
import termios
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar

IPC_VERSION = 1
MAX_FRAME_BYTES = 512 * 1024 * 1024  # program JSON with inline module source can be big
#: what a worker's frame may hold beyond the answer's limit: the message around a return
#: (its tag, index, key) or a failure; frames are written as the answer is (UTF-8, not
#: ``\uXXXX``), so a return that fits the answer fits its frame
FRAME_ENVELOPE_BYTES = 1024 * 1024
MAX_FDS_PER_FRAME = 250  # below the kernel's SCM_MAX_FD (253)
_HEADER = struct.Struct(">I")
_FRAME_HEAD = struct.Struct(">IH")  # payload length, fd count

_REGISTRY: dict[str, type[Message]] = {}


class IpcError(Exception):
    """A malformed frame or message: the peer is not speaking this protocol."""


class FrameTooLarge(IpcError):
    """A frame announced more bytes than the reader accepts (``length`` > ``limit``)."""

    def __init__(self, length: int, limit: int) -> None:
        super().__init__(f"frame of {length} bytes, limit {limit} bytes")
        self.length = length
        self.limit = limit


@dataclass
class Message:
    """Base of every message; subclasses set ``tag`` and declare their fields."""

    tag: ClassVar[str] = ""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.tag:
            _REGISTRY[cls.tag] = cls


# ---------------------------------------------------------------- front-end -> worker


@dataclass
class Configure(Message):
    """First message to a new worker: who it is and how to run."""

    tag: ClassVar[str] = "configure"
    worker_id: str
    generation: int
    device: str  # "cpu", "gpu" or "fake-gpu" (test-only runtime)
    gpu_ids: list[int] = field(default_factory=list)  # physical ids, logical order
    gpu_uuids: list[str] = field(default_factory=list)
    sandbox: str = "none"
    log_programs: bool = True
    allowed_serialization: list[str] = field(default_factory=lambda: ["json", "pickle"])
    transient: bool = False  # a gpu_count worker: one request, then exit
    #: a one-shot worker configured ahead of its program (a CPU spare): warm up once it
    #: has waited idle for its program (``worker.warm_up``), off the request's path
    warm_up: bool = False


@dataclass
class BlobSlice:
    """Where a blob's bytes are: ``fd_index`` into the frame's fds, plus offset and length."""

    sha256: str
    fd_index: int
    offset: int
    length: int


@dataclass
class RunProgram(Message):
    """Run one validated program. Blob memfds ride with this frame."""

    tag: ClassVar[str] = "run_program"
    request_id: str
    program_json: str  # the program as received (already validated by the front-end)
    workspace: str  # absolute path, created by the front-end
    stdout_path: str | None  # capture files; None when capture is disabled (limit 0)
    stderr_path: str | None
    blobs: list[BlobSlice] = field(default_factory=list)
    serialization: str | None = None  # format the request was admitted with, if any
    max_response_bytes: int = 268435456
    # Sandboxed workers cannot open the front-end's capture files by path: when set, these
    # are the indexes (into this frame's fds, after the blob fds) of the open stdout and
    # stderr files, used instead of the paths.
    capture_fds: list[int] = field(default_factory=list)
    # Index (into this frame's fds) of the worker's ``ProgressSlot`` memfd: sent with a
    # worker's first program, kept by the worker for the next ones.
    progress_fd: int | None = None
    # Send ``InstructionStarted`` frames too (a live follower; always without a progress slot)
    report_instructions: bool = True
    deadline_seconds: float | None = None  # left as it starts, for the benchmarks (SERVER §8)


@dataclass
class LeaseGranted(Message):
    tag: ClassVar[str] = "lease_granted"


@dataclass
class LeaseWithdrawn(Message):
    """The answer to ``LeaseAcquire`` instead of ``LeaseGranted``: the program was
    interrupted while it waited, so it stops there without the lease (EXTENSIONS §11)."""

    tag: ClassVar[str] = "lease_withdrawn"


@dataclass
class Shutdown(Message):
    """Finish nothing more; exit cleanly."""

    tag: ClassVar[str] = "shutdown"


# ---------------------------------------------------------------- worker -> front-end


@dataclass
class WorkerReady(Message):
    """Start-up (or reuse clean-up) finished; the worker can take a program."""

    tag: ClassVar[str] = "worker_ready"
    pid: int
    target: dict[str, str] = field(default_factory=dict)
    versions: dict[str, str] = field(default_factory=dict)
    device_uuid: str | None = None


#: ``WorkerRetiring.reason`` of a sandboxed worker whose workspace would not empty (§14)
SANDBOX_CLEANUP = "sandbox_cleanup"


@dataclass
class WorkerRetiring(Message):
    """Sent instead of ``WorkerReady`` after a program's clean-up when the worker must not
    take another program (``reason``: a ``worker_retired`` reason); it exits next."""

    tag: ClassVar[str] = "worker_retiring"
    reason: str


@dataclass
class WorkerExiting(Message):
    """A forked worker's last frame: it ran its exit handlers and killed its descendants,
    and ends now with ``code`` (``os._exit``); nothing of it can change its last program's
    answer any more. Its exit is still awaited before its seat or lease is handed on."""

    tag: ClassVar[str] = "worker_exiting"
    code: int


@dataclass
class WorkerStartFailed(Message):
    tag: ClassVar[str] = "worker_start_failed"
    error: str


@dataclass
class InstructionStarted(Message):
    tag: ClassVar[str] = "instruction_started"
    index: int
    op: str
    id: str | None
    output_sizes: list[int] | None = None  # stdout, stderr bytes written before it


@dataclass
class LeaseAcquire(Message):
    """Block until ``LeaseGranted``; the front-end pauses the deadline meanwhile."""

    tag: ClassVar[str] = "lease_acquire"


@dataclass
class LeaseRelease(Message):
    """GPU work is drained; the lease may go to another worker. No reply."""

    tag: ClassVar[str] = "lease_release"


@dataclass
class ReturnProduced(Message):
    """One successful ``return``: its encoded node and its binary parts.

    ``node`` is the PROTOCOL §7.5 node with final ``return:<i>`` part names; the parts' bytes
    are in the single memfd of this frame at ``part_lengths`` consecutive lengths (no fd when
    there are no parts).
    """

    tag: ClassVar[str] = "return_produced"
    index: int
    key: str
    node: dict[str, Any]
    part_lengths: list[int] = field(default_factory=list)


@dataclass
class ReturnTooLarge(Message):
    """Sent instead of a ``ReturnProduced`` whose frame (``length`` bytes) would pass what
    the front-end takes (``--max-response-bytes`` plus ``FRAME_ENVELOPE_BYTES``): the
    answer is then the 500 ``response_too_large`` it would have been, and the worker, whose
    channel the front-end would have broken, stays (a notebook session's state too)."""

    tag: ClassVar[str] = "return_too_large"
    index: int
    key: str
    length: int


@dataclass
class ProgramFinished(Message):
    """The program and its teardown are over.

    ``error`` is the PROTOCOL §7.6 object or None. ``left_processes`` is true when
    descendants had to be killed (the worker has already turned a COMPLETED program into
    FAILED for it); ``poisoned`` when the worker must not take more work (it then sends no
    ``WorkerReady`` and waits for ``Shutdown`` or its end). Once this message is sent the
    worker forgets the lease: ``lease_held`` says whether it held it at that moment, and
    the front-end releases it (for a retiring worker, after the process exited). A reused
    worker follows with ``WorkerReady``; a ``transient`` one exits instead.
    """

    tag: ClassVar[str] = "program_finished"
    status: str  # "COMPLETED" or "FAILED"
    error: dict[str, Any] | None = None
    left_processes: bool = False
    poisoned: bool = False
    lease_held: bool = False  # whether the worker still holds the lease after teardown
    # monotonic time (CLOCK_MONOTONIC, shared by all processes of the host) of the CUDA call
    # that broke a cpu_only run; the front-end alone knows who held the GPU then
    gpu_access_at: float | None = None


# One encoder for every frame: ``json.dumps`` with non-default arguments builds a new
# ``JSONEncoder`` per call. Messages hold plain JSON values (no cycles to check). Non-ASCII
# text stays UTF-8, as in the answer: ``\u00e9`` made a frame up to three times the answer
# it carries. A lone surrogate (a str may hold one) travels as ``surrogatepass`` bytes,
# which ``json.loads`` reads back the same way.
_ENCODER = json.JSONEncoder(separators=(",", ":"), check_circular=False, ensure_ascii=False)
_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _field_names(cls: type) -> tuple[str, ...]:
    names = _FIELD_NAMES.get(cls)
    if names is None:
        names = _FIELD_NAMES[cls] = tuple(f.name for f in fields(cls))
    return names


def encode(message: Message) -> bytes:
    # Field by field instead of ``dataclasses.asdict``, which deep-copies every value: the
    # only nested dataclass is ``BlobSlice``, sent as an object of its four fields.
    body: dict[str, Any] = {"t": message.tag, "v": IPC_VERSION}
    for name in _field_names(type(message)):
        body[name] = getattr(message, name)
    if type(message) is RunProgram and message.blobs:
        body["blobs"] = [
            {"sha256": b.sha256, "fd_index": b.fd_index, "offset": b.offset, "length": b.length}
            for b in message.blobs
        ]
    return _ENCODER.encode(body).encode("utf-8", "surrogatepass")


def decode(data: bytes | bytearray | str, fd_count: int) -> Message:
    try:
        body = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:  # nested too deep too
        raise IpcError(f"undecodable frame: {exc}") from None
    if type(body) is not dict or body.pop("v", None) != IPC_VERSION:
        raise IpcError("frame is not a versioned message")
    cls = _REGISTRY.get(body.pop("t", None))
    if cls is None:
        raise IpcError("unknown message tag")
    try:
        message = cls(**body)
    except TypeError as exc:
        unexpected = set(body) - set(_field_names(cls))
        if unexpected:
            raise IpcError(f"unexpected fields for {cls.tag}: {sorted(unexpected)}") from None
        raise IpcError(f"bad fields for {cls.tag}: {exc}") from None
    if cls is RunProgram:
        try:
            message.blobs = [BlobSlice(**b) for b in message.blobs]  # type: ignore[attr-defined]
        except TypeError as exc:
            raise IpcError(f"bad fields for {cls.tag}: {exc}") from None
    return message


# ---------------------------------------------------------------- blocking side (worker)


class BlockingChannel:
    """The worker's end: blocking send/receive of messages with optional fds."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.sock.setblocking(True)

    def send(self, message: Message, fds: Sequence[int] = ()) -> None:
        self.send_encoded(encode(message), fds)

    def send_encoded(self, payload: bytes, fds: Sequence[int] = ()) -> None:
        """Send a message ``encode`` made (its size known before it goes)."""
        frame = _FRAME_HEAD.pack(len(payload), len(fds)) + payload
        if fds:
            sent = self.sock.sendmsg(
                [frame], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))]
            )
            if sent < len(frame):
                self.sock.sendall(frame[sent:])
        else:
            self.sock.sendall(frame)

    def has_message(self, timeout: float) -> bool:
        """Whether the next message (or the front-end's end) arrives within ``timeout``
        seconds; nothing is read. Nothing is buffered on this side, so the socket says."""
        readable, _w, _x = select.select([self.sock], [], [], timeout)
        return bool(readable)

    def receive(self) -> tuple[Message, list[int]]:
        """Next message and the fds that came with it (caller owns and closes them)."""
        fds: list[int] = []
        head = self._read_exact(6, fds)
        (length,) = _HEADER.unpack(head[:4])
        (fd_count,) = struct.unpack(">H", head[4:6])
        if length > MAX_FRAME_BYTES:
            raise IpcError("frame too large")
        payload = self._read_exact(length, fds)
        if len(fds) != fd_count:
            for fd in fds:
                os.close(fd)
            raise IpcError(f"expected {fd_count} fds, got {len(fds)}")
        return decode(payload, fd_count), fds

    def _read_exact(self, n: int, fds: list[int]) -> bytes:
        chunks = bytearray()
        while len(chunks) < n:
            data, ancdata, _flags, _addr = self.sock.recvmsg(
                n - len(chunks), socket.CMSG_SPACE(MAX_FDS_PER_FRAME * 4)
            )
            fds.extend(_fds_from(ancdata))
            if not data:
                raise EOFError("peer closed the channel")
            chunks += data
        return bytes(chunks)


def _fds_from(ancdata: list[tuple[int, int, bytes]]) -> list[int]:
    fds: list[int] = []
    for level, kind, data in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            received = array.array("i")
            received.frombytes(data[: len(data) - (len(data) % received.itemsize)])
            fds.extend(received)
    return fds


# ---------------------------------------------------------------- asyncio side (front-end)


def _unread_bytes(sock: socket.socket) -> int:
    """Bytes waiting in the socket's receive queue (``FIONREAD``); 0 when unknown."""
    try:
        raw = fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0\0\0\0")
    except OSError:
        return 0
    return struct.unpack("i", raw)[0]


#: what an ``AsyncChannel`` hands on: a message with its fds, or why the channel broke
ChannelItem = tuple[Message, list[int]] | BaseException
#: bytes read per ``recvmsg`` (frames are small; a large one takes several rounds)
_RECEIVE_BYTES = 1 << 20


_receiving = threading.local()


def _receive_view() -> memoryview:
    """The buffer this thread's channels read into. ``recvmsg(n)`` allocates (and trims)
    an n-byte object per call: with n = 1 MiB that is an mmap and munmap per read; and one
    buffer per channel cost the same per fresh worker (zeroing 1 MiB, ~0.3 ms of the
    front-end's CPU). A reader callback copies what it read out before it returns, and one
    thread runs one callback at a time, so the thread's channels share one."""
    view: memoryview | None = getattr(_receiving, "view", None)
    if view is None:
        view = _receiving.view = memoryview(bytearray(_RECEIVE_BYTES))
    return view


def _frame_text(buffer: bytearray, end: int) -> str | bytearray:
    """The payload of the frame that ends at ``end`` of ``buffer``, taken out of it. A large
    one is decoded to text straight from the buffer: sliced out first, its copy lived on
    beside the text and the value ``json.loads`` made of it (a 200 MB return's peak: 595
    MB, now 405)."""
    payload: str | bytearray
    if end < _RECEIVE_BYTES:
        payload = buffer[_FRAME_HEAD.size : end]
    else:
        with memoryview(buffer) as view:
            try:
                payload = str(view[_FRAME_HEAD.size : end], "utf-8", "surrogatepass")
            except UnicodeDecodeError as exc:
                raise IpcError(f"undecodable frame: {exc}") from None
    del buffer[:end]
    return payload


class AsyncChannel:
    """The front-end's end: non-blocking, driven by the event loop (no thread per worker).

    Each message (then the exception that broke the channel, once) is handed to ``sink``
    from the reader callback as soon as its frame is complete: no queue, task or loop hop in
    between (``worker_channel.WorkerChannel`` is the sink that keeps an inbox).
    """

    def __init__(
        self,
        sock: socket.socket,
        sink: Callable[[ChannelItem], None],
        max_frame_bytes: int = MAX_FRAME_BYTES,
    ) -> None:
        self.sock = sock
        #: the largest frame read: past it the channel fails with ``FrameTooLarge`` as soon
        #: as the frame's head is in, before its bytes are held
        self.max_frame_bytes = max_frame_bytes
        self.sock.setblocking(False)
        self._loop = asyncio.get_running_loop()
        self._buffer = bytearray()
        self._receive_view = _receive_view()
        self._fds: list[int] = []
        self._deliver = sink
        self._closed = False
        self._loop.add_reader(self.sock.fileno(), self._on_readable)

    def _on_readable(self) -> None:
        try:
            size, ancdata, _flags, _addr = self.sock.recvmsg_into(
                [self._receive_view], socket.CMSG_SPACE(MAX_FDS_PER_FRAME * 4)
            )
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._fail(exc)
            return
        if ancdata:
            self._fds.extend(_fds_from(ancdata))
            if len(self._fds) > MAX_FDS_PER_FRAME:
                # A frame's descriptors are taken as soon as its bytes are in, so an honest
                # peer never has more waiting than one frame carries. A program could send
                # descriptors with no frame for them: the front-end's table filled (20000)
                # and it answered no one until the program ended.
                for fd in self._fds:
                    os.close(fd)
                self._fds = []
                self._fail(IpcError("the worker sent more descriptors than a frame carries"))
                return
        if not size:
            self._fail(EOFError("worker closed the channel"))
            return
        self._buffer += self._receive_view[:size]
        self._drain_frames()

    def _drain_frames(self) -> None:
        buffer = self._buffer
        while len(buffer) >= _FRAME_HEAD.size and not self._closed:
            length, fd_count = _FRAME_HEAD.unpack_from(buffer, 0)
            if length > self.max_frame_bytes:
                self._fail(FrameTooLarge(length, self.max_frame_bytes))
                return
            if fd_count > MAX_FDS_PER_FRAME:
                self._fail(IpcError("frame announced more fds than a frame carries"))
                return
            end = _FRAME_HEAD.size + length
            if len(buffer) < end:
                return
            try:
                payload = _frame_text(buffer, end)
            except IpcError as exc:
                self._fail(exc)
                return
            if len(self._fds) < fd_count:
                self._fail(IpcError("frame announced more fds than arrived"))
                return
            if fd_count:
                fds, self._fds = self._fds[:fd_count], self._fds[fd_count:]
            else:
                fds = []
            try:
                message = decode(payload, fd_count)
            except IpcError as exc:
                for fd in fds:
                    os.close(fd)
                self._fail(exc)
                return
            self._deliver((message, fds))

    def _fail(self, exc: BaseException) -> None:
        if not self._closed:
            self._stop_reading()
            self._deliver(exc)

    def _stop_reading(self) -> None:
        if not self._closed:
            self._closed = True
            try:
                self._loop.remove_reader(self.sock.fileno())
            except (ValueError, OSError):
                pass

    def finish(self, exc: BaseException) -> None:
        """The peer process is known to be gone (by its pid: a descendant may still hold its
        end open, so no EOF comes): decode every byte it sent, then fail with ``exc``, queued
        behind those frames so nothing the peer said before it died is lost."""
        for _ in range(1024):  # bounded: a surviving descendant could keep writing
            if self._closed or _unread_bytes(self.sock) <= 0:
                break
            self._on_readable()
        self._fail(exc)

    def send(self, message: Message, fds: Sequence[int] = ()) -> None:
        """Send without waiting. Frames are small, so a non-blocking send normally completes
        at once; only what does not fit in the socket buffer is sent blocking (bounded, to
        keep frames whole and in order). A worker that reads nothing for that long (wedged)
        leaves a broken channel (``OSError``)."""
        payload = encode(message)
        frame = _FRAME_HEAD.pack(len(payload), len(fds)) + payload
        ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
        try:
            sent = self.sock.sendmsg([frame], ancillary)
        except (BlockingIOError, InterruptedError):
            self._send_blocking(memoryview(frame), ancillary)  # nothing went, nor the fds
            return
        if sent < len(frame):
            self._send_blocking(memoryview(frame)[sent:], [])  # the fds went with byte 0

    def _send_blocking(self, view: memoryview, ancillary: list) -> None:
        self.sock.setblocking(True)
        self.sock.settimeout(5.0)
        try:
            if ancillary:
                sent = self.sock.sendmsg([view], ancillary)
                view = view[sent:]
            if view:
                self.sock.sendall(view)
        finally:
            self.sock.setblocking(False)

    def close(self) -> None:
        self._stop_reading()
        for fd in self._fds:
            os.close(fd)
        self._fds.clear()
        self.sock.close()
