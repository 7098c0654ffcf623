"""The fork server: workers forked from a preloaded launcher behave like spawned ones."""

from __future__ import annotations

import os
import signal
import socket

import pytest
from kcoral_server.processes import ipc
from kcoral_server.processes.launcher.front_end import Launcher


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


def _fork(launcher: Launcher, env: dict[str, str]):
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        process = launcher.launch(child.fileno(), env)
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
