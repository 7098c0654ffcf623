"""Drives a real worker process over a socketpair, as the front-end would."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kcoral_server.processes.ipc import (
    BlobSlice,
    BlockingChannel,
    Configure,
    LeaseAcquire,
    LeaseGranted,
    LeaseRelease,
    Message,
    ProgramFinished,
    ReturnProduced,
    RunProgram,
    Shutdown,
    WorkerReady,
    WorkerStartFailed,
)
from kcoral_server.processes.launcher.front_end import ForkedProcess, Launcher
from kcoral_server.processes.output_order import OutputOrder


def blocking_env(directory: Path, *modules: str) -> dict[str, str]:
    """An environment in which importing any of ``modules`` raises ImportError."""
    for name in modules:
        package = directory / name
        package.mkdir(parents=True, exist_ok=True)
        (package / "__init__.py").write_text(f"raise ImportError('{name} is blocked here')\n")
    return dict(os.environ, PYTHONPATH=str(directory))


def blob(data: bytes) -> tuple[str, bytes]:
    return hashlib.sha256(data).hexdigest(), data


@dataclass
class Result:
    messages: list[Message]
    finished: ProgramFinished
    returns: dict[str, tuple[dict, list[bytes]]]
    stdout: str
    stderr: str
    workspace: Path
    ready_again: bool = False

    @property
    def output_order(self) -> list[list[int]]:
        """The worker's last report of how stdout and stderr interleaved (EXTENSIONS §16)."""
        reports = [m.runs for m in self.messages if isinstance(m, OutputOrder)]
        return reports[-1] if reports else []

    @property
    def error(self) -> dict[str, Any] | None:
        return self.finished.error

    def value(self, key: str) -> dict:
        return self.returns[key][0]

    def trace(self) -> list[str]:
        """Message tags in order, instruction starts as ``start:<i>``."""
        names = []
        for message in self.messages:
            if message.tag == "instruction_started":
                names.append(f"start:{message.index}")  # type: ignore[attr-defined]
            else:
                names.append(message.tag)
        return names


@dataclass
class Worker:
    proc: subprocess.Popen | ForkedProcess
    channel: BlockingChannel
    tmp: Path
    transient: bool = False
    startup: list[Message] = field(default_factory=list)
    ready: WorkerReady | None = None
    failed: WorkerStartFailed | None = None
    runs: int = 0

    def receive(self) -> tuple[Message, list[int]]:
        return self.channel.receive()

    def run(
        self,
        instructions: list[dict],
        blobs: list[tuple[str, bytes]] = (),
        *,
        capture: bool = True,
        max_response_bytes: int = 268435456,
        expect_ready: bool | None = None,
        progress_fd: int | None = None,
    ) -> Result:
        """Run ``instructions``; ``progress_fd``: a progress slot's memfd
        (``ProgressSlot.create``), sent with the program and closed, as the front-end does."""
        import json

        self.runs += 1
        workspace = Path(tempfile.mkdtemp(prefix="kcoral-program-", dir=self.tmp))
        out = self.tmp / f"run{self.runs}.out"
        err = self.tmp / f"run{self.runs}.err"
        out.write_bytes(b"")
        err.write_bytes(b"")
        fds: list[int] = []
        slices: list[BlobSlice] = []
        if blobs:
            # all blobs back to back in one memfd, so offsets are exercised
            fd = os.memfd_create("test-blobs")
            offset = 0
            for sha, data in blobs:
                os.write(fd, data)
                slices.append(BlobSlice(sha256=sha, fd_index=0, offset=offset, length=len(data)))
                offset += len(data)
            fds.append(fd)
        progress_index = None
        if progress_fd is not None:
            progress_index = len(fds)
            fds.append(progress_fd)
        request = RunProgram(
            request_id=f"req-{self.runs}",
            program_json=json.dumps({"instructions": instructions}),
            workspace=str(workspace),
            stdout_path=str(out) if capture else None,
            stderr_path=str(err) if capture else None,
            blobs=slices,
            max_response_bytes=max_response_bytes,
            progress_fd=progress_index,
        )
        self.channel.send(request, fds)
        for fd in fds:
            os.close(fd)
        messages: list[Message] = []
        returns: dict[str, tuple[dict, list[bytes]]] = {}
        while True:
            message, received = self.receive()
            messages.append(message)
            if isinstance(message, LeaseAcquire):
                self.channel.send(LeaseGranted())
            elif isinstance(message, ReturnProduced):
                data = b""
                if received:
                    data = os.pread(received[0], 1 << 30, 0)
                parts, offset = [], 0
                for length in message.part_lengths:
                    parts.append(data[offset : offset + length])
                    offset += length
                returns[message.key] = (message.node, parts)
            for fd in received:
                os.close(fd)
            if isinstance(message, ProgramFinished):
                break
        result = Result(
            messages=messages,
            finished=message,  # type: ignore[arg-type]
            returns=returns,
            stdout=out.read_text(errors="replace"),
            stderr=err.read_text(errors="replace"),
            workspace=workspace,
        )
        if expect_ready is None:
            expect_ready = not self.transient and not message.poisoned  # type: ignore[attr-defined]
        if expect_ready:
            again, received = self.receive()
            assert isinstance(again, WorkerReady), again
            result.ready_again = True
        return result

    def shutdown(self) -> int:
        self.channel.send(Shutdown())
        return self.proc.wait(timeout=30)

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
            self.proc.wait(timeout=30)
        self.channel.sock.close()


def launch(
    tmp: Path,
    device: str = "cpu",
    *,
    transient: bool = False,
    gpu_uuids: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
    sandbox: str = "none",
    launcher: Launcher | None = None,
    warm_up: bool = False,
    wait_ready: bool = True,
) -> Worker:
    """A started worker: spawned (``python -m kcoral_server.worker``), or forked by
    ``launcher`` as the server's workers are. ``wait_ready=False``: returned as soon as it
    was configured, so that a program can be waiting for it when it reports ready."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    fd = child.fileno()
    if launcher is not None:
        proc: subprocess.Popen | ForkedProcess = launcher.launch(
            fd, dict(os.environ if env is None else env)
        )
    else:
        command = [sys.executable, "-m", "kcoral_server.worker", "--fd", str(fd)]
        log = open(tmp / "worker.log", "ab")
        proc = subprocess.Popen(
            command,
            pass_fds=[fd],
            start_new_session=True,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            cwd=tmp,
        )
        log.close()
    child.close()
    channel = BlockingChannel(parent)
    parent.settimeout(60)  # a wedged worker fails the test instead of hanging it
    worker = Worker(proc=proc, channel=channel, tmp=tmp, transient=transient)
    channel.send(
        Configure(
            worker_id=f"{device}/w0",
            generation=1,
            device=device,
            gpu_uuids=list(gpu_uuids),
            transient=transient,
            sandbox=sandbox,  # "bubblewrap" without bwrap: the worker's own clean-up only
            warm_up=warm_up,
        )
    )
    while wait_ready:
        message, fds = channel.receive()
        for received in fds:
            os.close(received)
        worker.startup.append(message)
        if isinstance(message, LeaseAcquire):
            channel.send(LeaseGranted())
        elif isinstance(message, LeaseRelease):
            continue
        elif isinstance(message, WorkerReady):
            worker.ready = message
            return worker
        elif isinstance(message, WorkerStartFailed):
            worker.failed = message
            return worker
    return worker


# ---------------------------------------------------------------- program builders


def module(ident: str, source: str, **extra: Any) -> dict:
    return {"op": "upload", "kind": "module", "id": ident, "source": source, **extra}


def function(ident: str, module_id: str, name: str, cpu_only: bool = False) -> dict:
    instruction = {"op": "get_function", "id": ident, "module": {"$ref": module_id}, "name": name}
    if cpu_only:
        instruction["cpu_only"] = True
    return instruction


def call(ident: str, fn: str, *args: Any) -> dict:
    return {"op": "run", "id": ident, "fn": {"$ref": fn}, "args": list(args)}


def ref(ident: str) -> dict:
    return {"$ref": ident}


def give(key: str, ident: str) -> dict:
    return {"op": "return", "key": key, "value": {"$ref": ident}}


def give_path(key: str, kind: str, path: Any) -> dict:
    return {"op": "return", "key": key, "kind": kind, "path": path}
