"""The fork server: workers forked from a preloaded launcher behave like spawned ones."""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from kcoral_server.processes import ipc
from kcoral_server.processes.launcher.front_end import Launcher
from kcoral_server.processes.launcher.wire import ENTRY_MODULE, STATUS, LaunchRequest
from kcoral_server.processes.sandbox import worker_base_environment


def _configure() -> ipc.Configure:
    return ipc.Configure(
        worker_id="cpu/w0",
        generation=1,
        device="cpu",
        gpu_ids=[],
        gpu_uuids=[],
        sandbox="none",
        log_programs=False,
        allowed_serialization=["json"],
        transient=False,
    )


@pytest.fixture
def launcher():
    launcher = Launcher()
    yield launcher
    launcher.close()


def _fork(launcher: Launcher, env: dict[str, str], *, hold: bool = False, cgroups=()):
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        process = launcher.launch(child.fileno(), env, cgroups=cgroups, hold=hold)
    finally:
        child.close()
    return process, ipc.BlockingChannel(parent)


def test_a_forked_worker_starts_and_reports_ready_with_its_own_pid(launcher):
    process, channel = _fork(launcher, dict(os.environ))
    channel.sock.settimeout(60)
    channel.send(_configure())
    message, _fds = channel.receive()
    assert isinstance(message, ipc.WorkerReady)
    assert message.pid == process.pid
    assert process.poll() is None
    channel.send(ipc.Shutdown())
    assert process.wait(30) == 0
    channel.sock.close()


def test_a_killed_forked_worker_reports_the_signal_as_its_exit_code(launcher):
    process, channel = _fork(launcher, dict(os.environ))
    os.kill(process.pid, signal.SIGKILL)
    assert process.wait(30) == -signal.SIGKILL
    channel.sock.close()


def test_a_forked_worker_leads_its_own_session(launcher):
    process, channel = _fork(launcher, dict(os.environ))
    channel.sock.settimeout(60)
    channel.send(_configure())
    channel.receive()
    assert os.getsid(process.pid) == process.pid
    channel.sock.close()  # EOF: the worker exits by itself
    assert process.wait(30) == 0


# ------------------------------------------- a worker forked ahead (SERVER §6)


def test_a_worker_forked_ahead_enters_its_cgroups_then_answers_nothing_until_released(
    launcher, tmp_path: Path
):
    procs = tmp_path / "cgroup.procs"  # a plain file: it shows what the child wrote, and when
    procs.write_text("")
    process, channel = _fork(launcher, dict(os.environ), hold=True, cgroups=[str(procs)])
    assert process.held
    deadline = 50
    while procs.read_text() != "0" and deadline:  # written by the child itself, at once
        deadline -= 1
        select.select([], [], [], 0.1)
    assert procs.read_text() == "0"
    channel.send(_configure())
    channel.sock.settimeout(0.5)
    with pytest.raises(TimeoutError):
        channel.receive()  # held: nothing of the worker runs
    assert process.poll() is None
    process.release()
    channel.sock.settimeout(60)
    message, _fds = channel.receive()
    assert isinstance(message, ipc.WorkerReady) and message.pid == process.pid
    channel.send(ipc.Shutdown())
    assert process.wait(30) == 0
    channel.sock.close()


def test_a_worker_forked_ahead_and_given_up_exits_without_running(launcher):
    process, channel = _fork(launcher, dict(os.environ), hold=True)
    channel.send(_configure())
    process.drop()
    assert process.wait(30) == 125
    channel.sock.settimeout(5)
    try:
        answer = channel.sock.recv(1)
    except ConnectionResetError:  # it went with our Configure unread
        answer = b""
    assert answer == b""  # it never answered
    channel.sock.close()


def test_a_held_worker_keeps_no_exit_report_of_another_worker_open(launcher):
    first, first_channel = _fork(launcher, dict(os.environ))
    assert first.status_fd is not None
    report = os.dup(first.status_fd)  # what the server's exit watch reads
    held, held_channel = _fork(launcher, dict(os.environ), hold=True)
    try:
        os.kill(first.pid, signal.SIGKILL)
        assert first.wait(30) == -signal.SIGKILL  # reads the report off the shared pipe
        # ...after which only the pipe's end tells the watch: a held child forked after
        # ``first`` must not keep the launcher's write end open while it waits
        readable, _w, _x = select.select([report], [], [], 10)
        assert readable and os.read(report, 64) == b""
    finally:
        os.close(report)
        held.drop()
        assert held.wait(30) == 125
        for channel in (first_channel, held_channel):
            channel.sock.close()


def test_a_forked_worker_takes_exactly_its_environment_changing_only_what_differs() -> None:
    import ctypes

    from kcoral_server.processes.launcher.forked_worker import take_environment

    libc = ctypes.CDLL(None)
    libc.getenv.restype = ctypes.c_char_p
    saved = dict(os.environ)
    wanted = {k: v for k, v in saved.items() if k != "HOME"}
    wanted["KCORAL_TEST_ADDED"] = "new"
    wanted["PATH"] = "/changed"
    try:
        take_environment(wanted)
        assert dict(os.environ) == wanted
        assert libc.getenv(b"HOME") is None  # the C environment too: what native code reads
        assert libc.getenv(b"PATH") == b"/changed"
        assert libc.getenv(b"KCORAL_TEST_ADDED") == b"new"
    finally:
        os.environ.clear()
        os.environ.update(saved)


def test_prctl_uses_the_function_looked_up_before_the_fork(monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``CDLL`` made in each fresh fork copied ~70 pages; the one made at import serves."""
    import ctypes

    from kcoral_server.processes.launcher.forked_worker import set_dumpable

    def no_new_library(*_args: object, **_kwargs: object) -> None:
        raise AssertionError("a new CDLL per call")

    monkeypatch.setattr(ctypes, "CDLL", no_new_library)
    assert set_dumpable(True) is True


# The fork server's bookkeeping, in a process of its own (it reaps any child of its
# process): 50 workers that exit one after the other. (A spawn supervisor keeps its one
# worker's code: tests/reliability/test_quarantine.py sees it exit with it.)
REPORTS_KEPT = """
import json, os, select
from kcoral_server.processes.launcher import family, wire

def fork_and_report(bookkeeping, code):
    status_r, status_w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os._exit(code)
    bookkeeping.workers[pid] = status_w
    while not select.select([status_r], [], [], 0.01)[0]:
        bookkeeping.collect()
    reported, _survivors = wire.STATUS.unpack(os.read(status_r, wire.STATUS.size))
    os.close(status_r)
    return pid, reported

server = family.Family()
codes = [fork_and_report(server, n % 7)[1] for n in range(50)]
print(json.dumps({"codes": codes, "kept_by_server": len(server.reported)}))
"""


def test_the_fork_server_reports_every_exit_and_keeps_no_code_of_its_thousands_of_workers() -> None:
    """A worker per program for as long as the server runs: a code kept for each would grow
    the fork server's heap, and so every fork, without end."""
    done = subprocess.run(
        [sys.executable, "-c", REPORTS_KEPT], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["codes"] == [n % 7 for n in range(50)]
    assert seen["kept_by_server"] == 0


def _launcher_killed(launcher: Launcher) -> None:
    assert launcher._process is not None
    launcher._process.kill()
    launcher._process.wait(30)


def test_a_held_worker_whose_launcher_died_counts_as_leaving_nothing_behind(launcher):
    # A seat's sandbox closed for another identity takes its fork server along; a worker
    # held there ran nothing, so its end is confirmed (before: survivors -1, "its launcher
    # died before reporting on its descendants", and the whole pool stopped admitting).
    held, channel = _fork(launcher, dict(os.environ), hold=True)
    _launcher_killed(launcher)
    assert held.wait(30) == -signal.SIGKILL  # the parent-death signal took it too
    assert held.survivors == 0
    channel.sock.close()


def test_a_released_worker_whose_launcher_died_leaves_its_descendants_unknown(launcher):
    released, channel = _fork(launcher, dict(os.environ), hold=True)
    released.release()
    _launcher_killed(launcher)
    assert released.wait(30) == -signal.SIGKILL
    assert released.survivors == -1  # who watched its orphans is gone: not confirmed
    channel.sock.close()


# A stand-in for torch whose import lasts until the test says so (a real one takes seconds).
SLOW_TORCH = """
import os, pathlib, time
pathlib.Path(os.environ["SLOW_TORCH_STARTED"]).touch()
while not os.path.exists(os.environ["SLOW_TORCH_GATE"]):
    time.sleep(0.01)
"""


class StandInTorch:
    """``torch.py`` in ``folder`` holding ``source`` (``SLOW_TORCH`` or
    ``INTERRUPTIBLE_TORCH``), and the files it and the test signal each other through."""

    def __init__(self, folder: Path, source: str) -> None:
        (folder / "torch.py").write_text(source)
        self.folder = folder
        self.started, self.gate, self.interrupted = (
            folder / "started",
            folder / "gate",
            folder / "raised",
        )

    def environment(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` with this stand-in first on the path and its files named."""
        path = os.pathsep.join(filter(None, [str(self.folder), os.environ.get("PYTHONPATH")]))
        return dict(
            base,
            PYTHONPATH=path,
            SLOW_TORCH_STARTED=str(self.started),
            SLOW_TORCH_GATE=str(self.gate),
            SLOW_TORCH_INTERRUPTED=str(self.interrupted),
        )


def _forked_then_importing(launcher: Launcher, torch: StandInTorch) -> tuple[Any, socket.socket]:
    """A worker forked by ``launcher``, which then starts its preload of ``torch`` and stays
    in it; the worker and the test's end of its socket."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        worker = launcher.launch(
            child.fileno(),
            dict(os.environ),
            launcher_env=torch.environment(worker_base_environment()),
        )
    finally:
        child.close()
    while not torch.started.exists():  # then the launcher is in the import, and stays there
        assert launcher._process is not None and launcher._process.poll() is None
        select.select([], [], [], 0.01)
    return worker, parent


def test_a_worker_killed_during_the_preload_is_reported_before_the_import_ends(
    tmp_path: Path,
) -> None:
    """The server's first cancel comes while its fork servers import torch; the kill waits
    for the worker's exit report, which the launcher sent only once the import ended
    (the first cancel took 1-3 s, every later one milliseconds)."""
    torch = StandInTorch(tmp_path, SLOW_TORCH)
    launcher = Launcher(preload=("torch",))
    try:
        worker, parent = _forked_then_importing(launcher, torch)
        os.kill(worker.pid, signal.SIGKILL)
        assert worker.wait(30) == -signal.SIGKILL
        assert not torch.gate.exists()  # reported while the import still ran
        parent.close()
    finally:
        torch.gate.touch()
        launcher.close()


# ... and one that says whether anything was raised into it: a signal handler's exception
# lands wherever the import is, which in torch's C++ start-up aborts the launcher.
INTERRUPTIBLE_TORCH = """
import os, pathlib, time
pathlib.Path(os.environ["SLOW_TORCH_STARTED"]).touch()
while not os.path.exists(os.environ["SLOW_TORCH_GATE"]):
    try:
        time.sleep(0.01)
    except BaseException as exc:
        pathlib.Path(os.environ["SLOW_TORCH_INTERRUPTED"]).write_text(type(exc).__name__)
        raise
"""


def test_a_hang_up_during_the_preload_raises_nothing_into_it_and_exits_after_the_worker(
    tmp_path: Path,
) -> None:
    """The server stops seconds after its start, while its fork servers import torch: each
    exits once its workers' exits are reported, without waiting for the import or raising
    into it (an exception from the hang-up's signal handler, landing in torch's C++
    start-up, printed ``terminate called after throwing ... PreloadAbandoned`` and the
    launcher's workers were reported crashed)."""
    torch = StandInTorch(tmp_path, INTERRUPTIBLE_TORCH)
    gate, interrupted = torch.gate, torch.interrupted
    launcher = Launcher(preload=("torch",))
    try:
        worker, parent = _forked_then_importing(launcher, torch)
        process = launcher._process
        launcher.abandon()  # the server stops
        parent.close()  # ... and its worker, unconfigured, ends
        assert worker.wait(30) == 0
        assert worker.survivors == 0  # reported by the launcher, not guessed at its death
        assert process.wait(30) == 0
        assert not gate.exists()  # it did not wait for the import
        assert not interrupted.exists(), f"{interrupted.read_text()} was raised into the import"
    finally:
        gate.touch()
        launcher.close()


# A launcher whose worker exited just before its preload began (the SIGCHLD came before the
# import's handler), hung up on by a stopping server: real processes, in a process of its
# own (a collection kills its process's other children as orphans).
EXITED_BEFORE_THE_PRELOAD = """
import os, socket, sys
from kcoral_server.processes.launcher.family import Family
from kcoral_server.processes.launcher.fork_server import Preloads

status_w = int(sys.argv[1])
control, front_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
pid = os.fork()
if pid == 0:
    os._exit(7)
os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)  # a zombie: its SIGCHLD has come and gone
family = Family()
family.workers[pid] = status_w
front_end.close()  # the server stops
Preloads(["stand_in_import"]).run(family, control)
sys.exit("the launcher went on with the import")
"""


def test_a_worker_that_exits_just_before_the_preload_is_reported_and_a_hang_up_exits_at_once(
    tmp_path: Path,
) -> None:
    """The worker's exit is reported as the import starts, and the stopping launcher exits
    then, not after the import (which may take seconds, or never end)."""
    imported = tmp_path / "imported"
    (tmp_path / "stand_in_import.py").write_text(
        f"import pathlib\npathlib.Path({str(imported)!r}).touch()\n"
    )
    path = os.pathsep.join(filter(None, [str(tmp_path), os.environ.get("PYTHONPATH")]))
    status_r, status_w = os.pipe()
    try:
        launcher = subprocess.run(
            [sys.executable, "-c", EXITED_BEFORE_THE_PRELOAD, str(status_w)],
            env=dict(os.environ, PYTHONPATH=path),
            pass_fds=(status_w,),
            capture_output=True,
            text=True,
            timeout=60,
        )
        os.close(status_w)
        status_w = -1
        assert launcher.returncode == 0, launcher.stderr
        assert not imported.exists()
        code, survivors = STATUS.unpack(os.read(status_r, STATUS.size))
        assert (code, survivors) == (7, 0)
    finally:
        os.close(status_r)
        if status_w >= 0:
            os.close(status_w)


def test_a_hang_up_behind_a_queued_launch_request_still_ends_the_preloading_launcher(
    tmp_path: Path,
) -> None:
    """A program's launch waits on the socket for the import to end, and the server stops
    meanwhile: its hang-up comes behind that request, and the launcher, forking nothing
    more, exits without waiting for the import (a peek saw only the request, so the
    launcher waited for the whole import, and then forked a worker for nobody)."""
    torch = StandInTorch(tmp_path, INTERRUPTIBLE_TORCH)
    started, gate, interrupted = torch.started, torch.gate, torch.interrupted
    environment = torch.environment(os.environ)
    front_end, control = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    command = [sys.executable, "-m", ENTRY_MODULE, "--fd", str(control.fileno())]
    with open(tmp_path / "launcher.log", "w") as log:
        launcher = subprocess.Popen(
            [*command, "--preload", "torch"],
            pass_fds=(control.fileno(),),
            env=environment,
            stdout=log,
            stderr=log,
        )
    control.close()
    worker_end, their_end = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        while not started.exists():  # idle, the launcher began the import, and stays there
            assert launcher.poll() is None, (tmp_path / "launcher.log").read_text()
            select.select([], [], [], 0.01)
        request = LaunchRequest(env=worker_base_environment()).encode()
        socket.send_fds(front_end, [request], [their_end.fileno()])  # queued behind the import
        front_end.shutdown(socket.SHUT_RDWR)  # the server stops (``Launcher.abandon``)
        assert launcher.wait(30) == 0, (tmp_path / "launcher.log").read_text()
        assert not gate.exists()  # it did not wait for the import
        assert not interrupted.exists(), f"{interrupted.read_text()} was raised into the import"
    finally:
        gate.touch()
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
        for sock in (front_end, worker_end, their_end):
            sock.close()
