"""Cost of starting one CPU worker: spawn (what the server does today) vs preloaded fork.

Both ways run the real worker code (``kcoral_server.worker.main.serve``) and are timed from
"launch" to the worker's ``WorkerReady`` answer to ``Configure``, exactly as the front-end
waits for it:

* spawn: ``python -m kcoral_server.worker --fd N`` in a new session (``worker_handle``);
* fork: a launcher process that imported the worker modules once forks a child per request
  (``python benchmarks/perf_workers.py --launcher``), the shape a fork server would have.

So the ratio is known before the server grows a fork server.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

from kcoral_server.processes import ipc

HERE = Path(__file__).resolve().parent


def _handshake(channel: ipc.BlockingChannel) -> None:
    channel.send(ipc.Configure(worker_id="cpu/bench", generation=1, device="cpu"))
    message, fds = channel.receive()
    for fd in fds:
        os.close(fd)
    if not isinstance(message, ipc.WorkerReady):
        raise RuntimeError(f"worker answered {message.tag}")


def _stop(channel: ipc.BlockingChannel) -> None:
    with contextlib.suppress(OSError):
        channel.send(ipc.Shutdown())
    with contextlib.suppress(OSError, EOFError, ipc.IpcError):
        channel.receive()  # EOF once the worker exited
    channel.sock.close()


def spawn_start_seconds(reps: int) -> list[float]:
    samples = []
    for _ in range(reps):
        parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        command = [sys.executable, "-m", "kcoral_server.worker", "--fd", str(child.fileno())]
        start = time.perf_counter()
        process = subprocess.Popen(command, pass_fds=(child.fileno(),), start_new_session=True)
        child.close()
        channel = ipc.BlockingChannel(parent)
        _handshake(channel)
        samples.append(time.perf_counter() - start)
        _stop(channel)
        process.wait(timeout=30)
    return samples


def fork_start_seconds(reps: int) -> list[float]:
    control, remote = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    launcher = subprocess.Popen(
        [sys.executable, str(HERE / "perf_workers.py"), "--launcher", str(remote.fileno())],
        pass_fds=(remote.fileno(),),
    )
    remote.close()
    samples = []
    try:
        if control.recv(1) != b"r":  # the launcher finished its imports
            raise RuntimeError("the fork launcher did not start")
        for _ in range(reps):
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            start = time.perf_counter()
            socket.send_fds(control, [b"f"], [child.fileno()])
            child.close()
            channel = ipc.BlockingChannel(parent)
            _handshake(channel)
            samples.append(time.perf_counter() - start)
            _stop(channel)
    finally:
        control.close()  # the launcher exits on EOF
        launcher.wait(timeout=30)
    return samples


def run_launcher(control_fd: int) -> None:
    """Preload the worker's imports, then fork one worker per fd received on ``control_fd``."""
    from kcoral_server.worker import main as worker_main

    control = socket.socket(fileno=control_fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # children are reaped automatically
    control.sendall(b"r")
    while True:
        try:
            _msg, fds, _flags, _addr = socket.recv_fds(control, 1, 1)
        except OSError:
            return
        if not fds:
            return
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                control.close()
                os.setsid()
                sock = socket.socket(fileno=fds[0])
                code = worker_main.serve(ipc.BlockingChannel(sock))
                worker_main.kill_descendants()
            finally:
                os._exit(code)
        os.close(fds[0])


def summary(samples: list[float]) -> float:
    return statistics.median(samples)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--launcher":
        run_launcher(int(sys.argv[2]))
    elif len(sys.argv) > 2 or not all(arg.isdigit() for arg in sys.argv[1:]):
        sys.exit("usage: python benchmarks/perf_workers.py [REPETITIONS]")
    else:
        reps = int(sys.argv[1]) if len(sys.argv) > 1 else 5
        print(f"spawn {summary(spawn_start_seconds(reps)) * 1000:.1f} ms")
        print(f"fork  {summary(fork_start_seconds(reps)) * 1000:.1f} ms")
