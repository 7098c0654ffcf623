"""Front-end <-> worker IPC (``kcoral_server.processes.ipc``): the message codec, the non-blocking
send, and the channel's direct delivery of each frame to its sink."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import socket
import struct
import threading
from dataclasses import fields

import pytest
from kcoral_server.processes import ipc
from kcoral_server.processes.handle import worker_frame_limit
from kcoral_server.processes.progress_slot import ProgressSlot
from kcoral_server.settings.config import ServerConfig

from kcoral.protocol.strict_json import dumps_compact

SAMPLES: list[ipc.Message] = [
    ipc.Configure(
        worker_id="w0",
        generation=3,
        device="gpu",
        gpu_ids=[1, 0],
        gpu_uuids=["GPU-a", "GPU-b"],
        sandbox="bubblewrap",
        log_programs=False,
        allowed_serialization=["json"],
        transient=True,
    ),
    ipc.RunProgram(
        request_id="r1",
        program_json='{"instructions":[]}',
        workspace="/tmp/ws",
        stdout_path=None,
        stderr_path="/tmp/ws/err",
        blobs=[ipc.BlobSlice("ab" * 32, 0, 16, 4), ipc.BlobSlice("cd" * 32, 1, 0, 9)],
        serialization="pickle",
        max_response_bytes=1234,
        capture_fds=[3, 4],
        progress_fd=2,
        report_instructions=False,
    ),
    ipc.LeaseGranted(),
    ipc.LeaseWithdrawn(),
    ipc.Shutdown(),
    ipc.WorkerReady(pid=42, target={"python": "3.11"}, versions={"kcoral": "0"}, device_uuid="u"),
    ipc.WorkerStartFailed(error="boom"),
    ipc.WorkerRetiring(reason=ipc.SANDBOX_CLEANUP),
    ipc.WorkerExiting(code=3),
    ipc.InstructionStarted(index=2, op="call", id=None),
    ipc.LeaseAcquire(),
    ipc.LeaseRelease(),
    ipc.ReturnProduced(
        index=1, key="k", node={"type": "bytes", "part": "return:0"}, part_lengths=[3]
    ),
    ipc.ReturnTooLarge(index=2, key="big", length=300_000_000),
    ipc.ProgramFinished(
        status="FAILED",
        error={"kind": "user", "message": "x"},
        left_processes=True,
        poisoned=True,
        lease_held=True,
        gpu_access_at=12.5,
    ),
]


def _frame(body: object, fd_count: int = 0) -> bytes:
    payload = json.dumps(body).encode()
    return struct.pack(">IH", len(payload), fd_count) + payload


def test_every_message_type_survives_encode_and_decode_with_all_its_fields() -> None:
    assert {type(m) for m in SAMPLES} == {
        cls for cls in vars(ipc).values() if isinstance(cls, type) and getattr(cls, "tag", "")
    }
    for message in SAMPLES:
        decoded = ipc.decode(ipc.encode(message), 0)
        assert type(decoded) is type(message)
        assert decoded == message
        body = json.loads(ipc.encode(message))
        assert body["t"] == message.tag and body["v"] == ipc.IPC_VERSION
        assert set(body) - {"t", "v"} == {f.name for f in fields(message)}


def test_blob_slices_decode_as_blob_slices() -> None:
    decoded = ipc.decode(ipc.encode(SAMPLES[1]), 0)
    assert all(isinstance(b, ipc.BlobSlice) for b in decoded.blobs)  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    "body",
    [
        {"t": "shutdown", "v": ipc.IPC_VERSION + 1},
        {"t": "shutdown"},
        ["shutdown", 1],
        {"t": "no_such_tag", "v": ipc.IPC_VERSION},
        {"t": "worker_start_failed", "v": ipc.IPC_VERSION},
        {"t": "worker_start_failed", "v": ipc.IPC_VERSION, "error": "x", "extra": 1},
        {
            "t": "run_program",
            "v": ipc.IPC_VERSION,
            "request_id": "r",
            "program_json": "{}",
            "workspace": "/w",
            "stdout_path": None,
            "stderr_path": None,
            "blobs": [{"sha256": "x", "fd_index": 0}],
        },
    ],
)
def test_a_malformed_or_foreign_frame_is_an_ipc_error(body: object) -> None:
    with pytest.raises(ipc.IpcError):
        ipc.decode(json.dumps(body).encode(), 0)


def test_an_unexpected_field_is_named_in_the_error() -> None:
    body = {"t": "worker_start_failed", "v": ipc.IPC_VERSION, "error": "x", "extra": 1}
    with pytest.raises(ipc.IpcError, match="unexpected fields for worker_start_failed"):
        ipc.decode(json.dumps(body).encode(), 0)


def test_a_frame_larger_than_the_socket_buffer_arrives_whole_with_its_descriptors() -> None:
    async def main() -> None:
        front, back = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        front.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        channel = ipc.AsyncChannel(front, sink=_ignore)
        worker = ipc.BlockingChannel(back)
        received: list[tuple[ipc.Message, list[int]]] = []

        def read() -> None:
            for _ in range(3):
                received.append(worker.receive())

        reader = threading.Thread(target=read)
        reader.start()
        r, w = os.pipe()
        try:
            big = ipc.RunProgram(
                request_id="big",
                program_json="x" * (3 << 20),
                workspace="/w",
                stdout_path=None,
                stderr_path=None,
            )
            # the blocking fallback runs on this thread while the reader drains the socket
            channel.send(big, [r])
            channel.send(ipc.LeaseGranted(), [w, r])
            channel.send(ipc.Shutdown())
            reader.join(10)
            assert not reader.is_alive()
        finally:
            os.close(r)
            os.close(w)
            channel.close()
            back.close()
        (first, fds1), (second, fds2), (third, fds3) = received
        assert first == big and len(fds1) == 1
        assert isinstance(second, ipc.LeaseGranted) and len(fds2) == 2
        assert isinstance(third, ipc.Shutdown) and fds3 == []
        # the descriptors are the pipe's ends, in the order sent
        assert os.fstat(fds1[0]).st_ino == os.fstat(fds2[1]).st_ino
        assert os.fstat(fds2[0]).st_ino == os.fstat(fds1[0]).st_ino
        for fd in (*fds1, *fds2):
            os.close(fd)

    asyncio.run(main())


def test_a_send_that_finds_the_socket_full_keeps_frames_whole_and_in_order() -> None:
    async def main() -> None:
        front, back = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        front.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4096)
        channel = ipc.AsyncChannel(front, sink=_ignore)
        filled = 0
        for size in (4096, 1):  # fill the socket: the next sendmsg finds no room at all
            while True:
                try:
                    filled += front.send(b"\0" * size)
                except BlockingIOError:
                    break
        worker = ipc.BlockingChannel(back)
        messages: list[tuple[ipc.Message, list[int]]] = []

        def read() -> None:
            left = filled
            while left:
                left -= len(back.recv(left))
            messages.append(worker.receive())
            messages.append(worker.receive())

        reader = threading.Thread(target=read)
        reader.start()
        r, w = os.pipe()
        try:
            channel.send(ipc.LeaseGranted(), [r])
            channel.send(ipc.WorkerStartFailed(error="second"))
            reader.join(10)
            assert not reader.is_alive()
        finally:
            os.close(r)
            os.close(w)
            channel.close()
            back.close()
        first, fds = messages[0]
        assert isinstance(first, ipc.LeaseGranted) and len(fds) == 1
        os.close(fds[0])
        assert messages[1] == (ipc.WorkerStartFailed(error="second"), [])

    asyncio.run(main())


def test_a_sink_gets_each_message_in_order_then_the_failure_once() -> None:
    async def main() -> list[object]:
        front, back = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        items: list[object] = []
        done = asyncio.get_running_loop().create_future()

        def sink(item: ipc.ChannelItem) -> None:
            items.append(item)
            if isinstance(item, BaseException):
                done.set_result(None)

        channel = ipc.AsyncChannel(front, sink=sink)
        frames = b"".join(
            _frame({"t": "instruction_started", "v": 1, "index": i, "op": "call", "id": None})
            for i in range(3)
        )
        back.sendall(frames[:7])  # a frame split across reads
        await asyncio.sleep(0.01)
        back.sendall(frames[7:])
        back.close()
        await asyncio.wait_for(done, 5)
        channel.close()
        return items

    items = asyncio.run(main())
    assert [m.index for m, _fds in items[:3]] == [0, 1, 2]  # type: ignore[union-attr]
    assert len(items) == 4 and isinstance(items[3], EOFError)


def test_a_frame_announcing_missing_descriptors_breaks_the_channel() -> None:
    async def main() -> list[object]:
        front, back = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        items: list[object] = []
        broken = asyncio.get_running_loop().create_future()

        def sink(item: ipc.ChannelItem) -> None:
            items.append(item)
            if isinstance(item, BaseException) and not broken.done():
                broken.set_result(None)

        channel = ipc.AsyncChannel(front, sink=sink)
        back.sendall(_frame({"t": "shutdown", "v": 1}, fd_count=1))
        try:
            await asyncio.wait_for(broken, 5)
            back.sendall(_frame({"t": "shutdown", "v": 1}))  # and stays broken: not read
            await asyncio.sleep(0.05)
        finally:
            channel.close()
            back.close()
        return items

    items = asyncio.run(main())
    assert len(items) == 1 and isinstance(items[0], ipc.IpcError)


def _first_item(frames: bytes, max_frame_bytes: int) -> ipc.ChannelItem:
    """What a channel taking frames up to ``max_frame_bytes`` hands on first for ``frames``
    (the sending end stays open: a refusal cannot be the peer's end)."""

    async def main() -> ipc.ChannelItem:
        front, back = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        first = asyncio.get_running_loop().create_future()

        def sink(item: ipc.ChannelItem) -> None:
            if not first.done():
                first.set_result(item)

        channel = ipc.AsyncChannel(front, sink=sink, max_frame_bytes=max_frame_bytes)
        sender = threading.Thread(target=back.sendall, args=(frames,), daemon=True)
        sender.start()
        try:
            return await asyncio.wait_for(first, 30)
        finally:
            channel.close()  # a sender blocked on a refused frame's rest fails then
            sender.join()
            back.close()

    return asyncio.run(main())


def test_a_frame_announcing_more_than_the_channel_takes_is_refused_at_its_head() -> None:
    # Only the head is sent: the refusal comes before any of the frame's bytes are held.
    item = _first_item(struct.pack(">IH", 4 * 1024 * 1024 + 1, 0), max_frame_bytes=4 * 1024 * 1024)
    assert isinstance(item, ipc.FrameTooLarge)
    assert (item.length, item.limit) == (4 * 1024 * 1024 + 1, 4 * 1024 * 1024)
    assert str(item) == "frame of 4194305 bytes, limit 4194304 bytes"


def test_a_large_frame_up_to_the_limit_arrives_with_its_text_as_sent() -> None:
    # Past one read (1 MiB) a frame is decoded from the buffer itself; non-ASCII text and a
    # lone surrogate (a Python str may hold one) come back as they were.
    value = "é中\ud800" + "x" * 3_000_000
    frame = ipc.encode(ipc.ReturnProduced(index=0, key="k", node={"value": value}))
    item = _first_item(struct.pack(">IH", len(frame), 0) + frame, max_frame_bytes=len(frame))
    assert not isinstance(item, BaseException), item
    message, _fds = item
    assert isinstance(message, ipc.ReturnProduced) and message.node["value"] == value


def test_a_large_frame_that_is_not_utf8_breaks_the_channel() -> None:
    frame = b'{"t":"shutdown","v":1,"x":"' + b"\xff" * 2_000_000 + b'"}'
    item = _first_item(struct.pack(">IH", len(frame), 0) + frame, max_frame_bytes=len(frame))
    assert isinstance(item, ipc.IpcError) and "undecodable frame" in str(item)


def test_a_non_ascii_return_travels_in_no_more_bytes_than_its_answer_carries() -> None:
    # The cap is the answer's limit plus an envelope: a frame written with \uXXXX escapes
    # was up to three times the UTF-8 answer, so a return that fit the answer was refused.
    node = {"type": "str", "value": "é" * 1000 + "中" * 1000}
    frame = ipc.encode(ipc.ReturnProduced(index=0, key="k", node=node))
    assert len(frame) < len(dumps_compact(node)) + 100


def test_a_worker_may_send_the_front_end_what_an_answer_carries_and_no_more() -> None:
    config = ServerConfig(max_response_bytes=1000)
    assert worker_frame_limit(config) == 1000 + ipc.FRAME_ENVELOPE_BYTES
    assert worker_frame_limit(ServerConfig()) < ipc.MAX_FRAME_BYTES


def _ignore(item: ipc.ChannelItem) -> None:
    """A sink for channels that only send in a test."""


# ---------------------------------------------------------------- progress slot


def test_a_progress_slot_says_which_instruction_the_other_process_started_last() -> None:
    slot, fd = ProgressSlot.create()
    try:
        worker_side = ProgressSlot.attach(fd)
    finally:
        os.close(fd)
    slot.reset()
    assert slot.last_started(4) is None
    worker_side.started(0)
    assert slot.last_started(4) == 0
    worker_side.started(3)
    assert slot.last_started(4) == 3
    slot.reset()
    assert worker_side.last_started(4) is None


@pytest.mark.parametrize("written", [-5, 0, 6, 2**62])  # 1..5 name instructions 0..4
def test_a_progress_value_that_names_no_instruction_of_the_program_is_not_trusted(
    written: int,
) -> None:
    slot, fd = ProgressSlot.create()
    worker_side = ProgressSlot.attach(fd)
    os.close(fd)
    worker_side.started(written - 1)  # what uploaded code in the worker can write
    assert slot.last_started(5) is None


def test_the_worker_cannot_shrink_the_progress_memfd_under_the_front_end() -> None:
    # A worker (uploaded code) that truncated the memfd would make the front-end's next
    # read of its mapping a SIGBUS: the memfd is sealed before it is sent.
    slot, fd = ProgressSlot.create()
    try:
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 0)
        with pytest.raises(PermissionError):
            os.ftruncate(fd, 1 << 20)
        with pytest.raises(PermissionError):
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, 0)  # nor remove or add seals
    finally:
        os.close(fd)
    assert slot.last_started(1) is None  # still readable


def test_a_closed_progress_slot_reads_as_no_instruction() -> None:
    slot, fd = ProgressSlot.create()
    os.close(fd)
    slot.started(0)
    slot.close()
    assert slot.last_started(1) is None


def test_a_progress_slot_keeps_no_descriptor_open() -> None:
    # the reliability suite counts the front-end's descriptors: one per worker would "leak"
    before = len(os.listdir("/proc/self/fd"))
    slot, fd = ProgressSlot.create()
    worker_side = ProgressSlot.attach(fd)
    os.close(fd)
    assert len(os.listdir("/proc/self/fd")) == before
    worker_side.started(1)
    assert slot.last_started(2) == 1
    slot.close()
    worker_side.close()
