"""A fork server for workers (SERVER §1): one preloaded process forks each new worker.

Spawning ``python -m kcoral_server.worker`` costs an interpreter start plus the worker's
imports (~1 s on a loaded machine); forking a process that already imported them costs
~25 ms. The launcher imports the worker modules but never torch and never CUDA, so a fork
is as clean as a spawn: the child sets its own environment (``CUDA_VISIBLE_DEVICES``
included) before anything reads it.

Protocol on the launcher's ``AF_UNIX`` ``SOCK_SEQPACKET`` control socket: the front-end
sends ``{"env": {...}}`` (JSON) with the worker's socketpair end; the launcher forks and
answers ``{"pid": N}`` with the read end of a status pipe, on which it writes the child's
exit code (``subprocess`` convention: ``-signal`` when killed) once it reaped it. Workers
are children of the launcher, not of the front-end, hence ``ForkedProcess`` instead of
``subprocess.Popen``.

Used only without the bubblewrap sandbox and without a limits cgroup: both wrap the worker
command, which a fork cannot do; those keep the spawn path.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

_STATUS = struct.Struct("<i")
_MAX_MESSAGE = 1 << 20  # the environment travels in one datagram
REAP_WAIT_SECONDS = 0.05  # the most ``poll`` waits for the launcher to report an exit
#: imported by the launcher before it forks anything (what every worker imports anyway)
PRELOADED = (
    "kcoral_server.worker.main",
    "kcoral_server.worker.engine",
    "kcoral.protocol.validate",
    "kcoral.protocol.values",
)


class LauncherError(OSError):
    """The launcher could not fork a worker (the caller may fall back to spawning)."""


class ForkedProcess:
    """The ``subprocess.Popen`` subset ``WorkerHandle`` uses, for a launcher's child."""

    def __init__(self, pid: int, status_fd: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._status_fd: int | None = status_fd
        os.set_blocking(status_fd, False)

    def poll(self) -> int | None:
        if self.returncode is not None or self._status_fd is None:
            return self.returncode
        try:
            data = os.read(self._status_fd, _STATUS.size)
        except BlockingIOError:
            if _pid_alive(self.pid):
                return None
            # Exited (its pidfd already says so) but not yet reaped by the launcher, which
            # writes the code within moments: wait for it rather than report "running".
            select.select([self._status_fd], [], [], REAP_WAIT_SECONDS)
            try:
                data = os.read(self._status_fd, _STATUS.size)
            except BlockingIOError:
                return None
            except OSError:
                data = b""
        except OSError:
            data = b""
        if len(data) == _STATUS.size:
            self.returncode = _STATUS.unpack(data)[0]
        elif _pid_alive(self.pid):
            return None  # the launcher died first; the worker itself still runs
        else:
            self.returncode = -signal.SIGKILL  # exit code lost with the launcher
        self._close()
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            remaining = None if deadline is None else deadline - time.monotonic()
            if remaining is not None and remaining <= 0:
                raise subprocess.TimeoutExpired(f"worker {self.pid}", timeout or 0.0)
            if self._status_fd is not None:
                # the status pipe turns readable at exit (or when the launcher goes away)
                select.select(
                    [self._status_fd], [], [], 0.05 if remaining is None else min(remaining, 0.05)
                )
            else:
                time.sleep(0.01)
        return self.returncode  # type: ignore[return-value]

    def _close(self) -> None:
        if self._status_fd is not None:
            with contextlib.suppress(OSError):
                os.close(self._status_fd)
            self._status_fd = None

    def __del__(self) -> None:
        self._close()


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


class Launcher:
    """The front-end's handle on its launcher process (started on first use)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen | None = None
        self._sock: socket.socket | None = None

    def launch(self, worker_fd: int, env: dict[str, str]) -> ForkedProcess:
        """Fork a worker on ``worker_fd`` with environment ``env`` (blocking; call it off
        the IO loop). Raises ``LauncherError``."""
        payload = json.dumps({"env": env}).encode()
        with self._lock:  # one request in flight: replies need no matching
            for attempt in (1, 2):  # a launcher that died is restarted once
                try:
                    sock = self._ensure_started()
                    socket.send_fds(sock, [payload], [worker_fd])
                    data, fds, _flags, _addr = socket.recv_fds(sock, _MAX_MESSAGE, 1)
                except OSError as exc:
                    self._stop_locked()
                    if attempt == 2:
                        raise LauncherError(f"worker launcher failed: {exc}") from None
                    continue
                if not data:
                    self._stop_locked()
                    if attempt == 2:
                        raise LauncherError("worker launcher exited")
                    continue
                reply = json.loads(data)
                if "pid" not in reply or len(fds) != 1:
                    for fd in fds:
                        os.close(fd)
                    raise LauncherError(reply.get("error", "worker launcher failed"))
                return ForkedProcess(int(reply["pid"]), fds[0])
        raise LauncherError("worker launcher failed")  # pragma: no cover

    def start(self) -> None:
        """Start the launcher now (e.g. in the background while the server starts)."""
        with self._lock:
            self._ensure_started()

    def _ensure_started(self) -> socket.socket:
        if self._sock is not None and self._process is not None and self._process.poll() is None:
            return self._sock
        self._stop_locked()
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "kcoral_server.launcher", "--fd", str(child.fileno())],
                pass_fds=(child.fileno(),),
                start_new_session=True,
            )
        except OSError:
            parent.close()
            raise
        finally:
            child.close()
        self._sock = parent
        return parent

    def close(self) -> None:
        with self._lock:
            self._stop_locked()

    def _stop_locked(self) -> None:
        if self._sock is not None:
            self._sock.close()  # the launcher exits on EOF; its workers live on
            self._sock = None
        if self._process is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self._process.wait(2)
            if self._process.poll() is None:
                self._process.kill()
                self._process.wait()
            self._process = None


_shared: Launcher | None = None
_shared_lock = threading.Lock()


def shared_launcher() -> Launcher:
    """The process-wide launcher (one per front-end)."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = Launcher()
        return _shared


# ---------------------------------------------------------------------- launcher process


@dataclass
class Child:
    """What a freshly forked child runs once the launcher's stack is unwound."""

    worker_fd: int
    env: dict[str, str]


def serve(control: socket.socket) -> Child | None:
    """The launcher loop; returns ``None`` in the launcher (exit) or a ``Child`` in a child."""
    for name in PRELOADED:
        __import__(name)
    import gc

    gc.collect()
    gc.freeze()  # pages the children never write stay shared, collections skip them
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake the select below
    status: dict[int, int] = {}  # pid -> write end of its status pipe
    try:
        while True:
            readable, _w, _x = select.select([control, wake_r], [], [])
            if wake_r in readable:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake_r, 512)
            _reap(status)
            if control not in readable:
                continue
            try:
                data, fds, _flags, _addr = socket.recv_fds(control, _MAX_MESSAGE, 4)
            except OSError:
                return None
            if not data:
                return None  # the front-end closed the socket
            child = _fork(control, data, fds, status, (wake_r, wake_w))
            if child is not None:
                return child
    finally:
        if status:  # the launcher leaves; its workers live on (their status pipes close)
            for fd in status.values():
                with contextlib.suppress(OSError):
                    os.close(fd)


def _fork(
    control: socket.socket,
    data: bytes,
    fds: list[int],
    status: dict[int, int],
    wake: tuple[int, int],
) -> Child | None:
    try:
        env = json.loads(data)["env"]
        if len(fds) != 1:
            raise ValueError(f"expected one descriptor, got {len(fds)}")
    except (ValueError, KeyError, TypeError) as exc:
        for fd in fds:
            os.close(fd)
        _reply(control, {"error": f"bad launch request: {exc}"}, [])
        return None
    worker_fd = fds[0]
    status_r, status_w = os.pipe()
    try:
        pid = os.fork()
    except OSError as exc:
        for fd in (worker_fd, status_r, status_w):
            os.close(fd)
        _reply(control, {"error": f"fork failed: {exc}"}, [])
        return None
    if pid == 0:  # the worker
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        control.close()
        for fd in (status_r, status_w, *wake, *status.values()):
            with contextlib.suppress(OSError):
                os.close(fd)
        status.clear()
        os.setsid()  # like start_new_session=True: the front-end kills the whole group
        return Child(worker_fd, env)
    os.close(worker_fd)
    status[pid] = status_w
    _reply(control, {"pid": pid}, [status_r])
    os.close(status_r)
    return None


def _reply(control: socket.socket, reply: dict, fds: list[int]) -> None:
    with contextlib.suppress(OSError):
        socket.send_fds(control, [json.dumps(reply).encode()], fds)


def _reap(status: dict[int, int]) -> None:
    while True:
        try:
            pid, wait_status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        fd = status.pop(pid, None)
        if fd is None:
            continue
        code = os.waitstatus_to_exitcode(wait_status)
        with contextlib.suppress(OSError):
            os.write(fd, _STATUS.pack(code))
        os.close(fd)


def run_child(child: Child) -> int:
    """In the forked worker: take the requested environment, then run the worker."""
    os.environ.clear()
    os.environ.update(child.env)
    from kcoral_server.worker import __main__ as entry
    from kcoral_server.worker.main import main as worker_main

    sys.argv = [entry.__file__, "--fd", str(child.worker_fd)]  # as if spawned

    return worker_main(["--fd", str(child.worker_fd)])


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] != "--fd":
        print("usage: python -m kcoral_server.launcher --fd N", file=sys.stderr)
        return 2
    control = socket.socket(fileno=int(args[1]))
    child = serve(control)
    if child is None:
        return 0
    code = run_child(child)
    _quick_exit(code)
    return code  # pragma: no cover


def _quick_exit(code: int) -> None:
    """Exit a forked worker without interpreter finalization: tearing down every module
    touches (and so copies) every page shared with the launcher, ~15 ms per worker. What a
    program could observe still happens: atexit handlers, finalizers of its garbage, flushed
    stdio."""
    import atexit
    import gc

    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    with contextlib.suppress(BaseException):
        gc.collect()  # start-up objects are frozen: this only walks what programs left
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(BaseException):
            stream.flush()
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())
