"""A worker's channel as the front-end reads it (``kcoral_server.processes.channel``): lease
messages answered by the handle's lease, the rest queued in order, ``receive`` without
``wait_for`` (timeouts, interrupts, cancelled receives), and a broken channel reported as
``WorkerGone`` on every later receive."""

from __future__ import annotations

import array
import asyncio
import json
import os
import socket
import struct

import pytest
from kcoral_server.processes import ipc
from kcoral_server.processes.channel import ReceiveInterrupted, WorkerGone
from kcoral_server.processes.handle import WorkerHandle


def _frame(body: object, fd_count: int = 0) -> bytes:
    payload = json.dumps(body).encode()
    return struct.pack(">IH", len(payload), fd_count) + payload


def _handle_on(front: socket.socket) -> WorkerHandle:
    handle = WorkerHandle(
        seat_id="s0", generation=1, device="cpu", gpu_ids=[], gpu_uuids=[], arbiter=None
    )
    handle.channel.attach(front)
    return handle


def test_the_handle_answers_lease_requests_itself_and_queues_the_rest_in_order() -> None:
    async def main() -> None:
        front, back = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        handle = _handle_on(front)
        worker = ipc.BlockingChannel(back)
        r, w = os.pipe()
        try:
            worker.send(ipc.InstructionStarted(index=0, op="call", id="a"))
            worker.send(ipc.LeaseAcquire())
            worker.sock.sendmsg(
                [_frame({"t": "program_finished", "v": 1, "status": "COMPLETED"}, 1)],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [r]))],
            )
            first, fds1 = await handle.channel.receive(5)
            second, fds2 = await handle.channel.receive(5)
            assert first == ipc.InstructionStarted(index=0, op="call", id="a") and fds1 == []
            assert isinstance(second, ipc.ProgramFinished) and len(fds2) == 1
            assert os.fstat(fds2[0]).st_ino == os.fstat(r).st_ino
            os.close(fds2[0])
            granted, _ = worker.receive()  # a CPU worker asking for the lease is granted
            assert isinstance(granted, ipc.LeaseGranted)
        finally:
            os.close(r)
            os.close(w)
            handle.close()
            back.close()

    asyncio.run(main())


def test_receive_times_out_is_interrupted_and_then_reports_the_worker_gone() -> None:
    async def main() -> None:
        front, back = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        handle = _handle_on(front)
        try:
            with pytest.raises(TimeoutError):
                await handle.channel.receive(0.01)
            asyncio.get_running_loop().call_later(0.01, handle.channel.interrupt)
            with pytest.raises(ReceiveInterrupted):
                await handle.channel.receive(5)
            waiting = asyncio.ensure_future(handle.channel.receive(5))
            await asyncio.sleep(0.01)
            back.close()  # the worker's end goes away
            with pytest.raises(WorkerGone, match="channel closed"):
                await waiting
            with pytest.raises(WorkerGone):  # every later receive too
                await handle.channel.receive(5)
        finally:
            handle.close()

    asyncio.run(main())


def test_a_cancelled_receive_leaves_the_next_message_for_the_next_receive() -> None:
    async def main() -> None:
        front, back = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        handle = _handle_on(front)
        worker = ipc.BlockingChannel(back)
        try:
            waiting = asyncio.ensure_future(handle.channel.receive(None))
            await asyncio.sleep(0.01)
            waiting.cancel()
            with pytest.raises(asyncio.CancelledError):
                await waiting
            worker.send(ipc.WorkerReady(pid=7))
            message, _ = await handle.channel.receive(5)
            assert message == ipc.WorkerReady(pid=7)
        finally:
            handle.close()
            back.close()

    asyncio.run(main())


def test_an_unreadable_worker_message_marks_the_worker_gone_as_invalid() -> None:
    async def main() -> None:
        front, back = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        handle = _handle_on(front)
        try:
            back.sendall(struct.pack(">IH", 3, 0) + b"{{{")
            with pytest.raises(WorkerGone) as caught:
                await handle.channel.receive(5)
            assert caught.value.invalid
        finally:
            handle.close()
            back.close()

    asyncio.run(main())
