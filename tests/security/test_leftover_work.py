"""Work that hides from the leftover checks (issue 28 point 2; SERVER §8, EXTENSIONS §11).

Two tricks got through before: a thread ``threading`` does not list (started with
``_thread.start_new_thread``, or a ``threading.Thread`` taken out of ``threading._active``)
kept running after ``COMPLETED``, in a session and on a reused worker; and a program that
turned off its worker's child-subreaper flag and double-forked an ``exec``'d process left
it running, re-parented to the launcher. Each test performs the trick against a real
server (with and without bubblewrap) and sees the program fail, its work ended, and the
session end. Native threads a library keeps (OpenBLAS's pool) must not fail a program.
"""

from __future__ import annotations

import concurrent.futures
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
from http_helpers import module_program, request
from kcoral_server.processes import sandbox
from kcoral_server.processes.launch import LAUNCH_ENV
from session_requests import create_session, run_in, value_of

BWRAP_PROBLEM = sandbox.probe()
SANDBOXES = [
    "none",
    pytest.param(
        "bubblewrap",
        marks=pytest.mark.skipif(
            BWRAP_PROBLEM is not None, reason=f"bubblewrap cannot run here: {BWRAP_PROBLEM}"
        ),
    ),
]

TRICKS = """
import _thread, ctypes, json, os, sys, threading, time

def raw_c_thread():
    # runs a C function: no Python frame, invisible to threading and to _current_frames
    _thread.start_new_thread(time.sleep, (600,))
    return json.dumps(os.getpid())

def raw_python_thread():
    def spin():
        while True:
            time.sleep(0.05)
    _thread.start_new_thread(spin, ())
    return json.dumps(os.getpid())

def unlisted_thread():
    thread = threading.Thread(target=time.sleep, args=(600,), name="kcoral-test-unlisted")
    thread.start()
    with threading._active_limbo_lock:
        threading._active.pop(thread.ident, None)  # threading.enumerate() forgets it
    return json.dumps(os.getpid())

def escaped_process(marker):
    # the worker stops being a subreaper: orphans now go to whoever is above it
    ctypes.CDLL(None).prctl(36, 0, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER, 0
    child = os.fork()
    if child == 0:
        if os.fork() == 0:
            os.setsid()
            os.execv("/bin/sleep", [marker, "600"])
        os._exit(0)
    os.waitpid(child, 0)
    return json.dumps(os.getpid())

def escape_and_wait(marker, flag):
    # the orphan keeps this worker's session: the launcher's other workers leave it alone
    ctypes.CDLL(None).prctl(36, 0, 0, 0, 0)
    child = os.fork()
    if child == 0:
        if os.fork() == 0:
            os.execv("/bin/sleep", [marker, "600"])
        os._exit(0)
    os.waitpid(child, 0)
    while not os.path.exists(flag):
        time.sleep(0.05)
    return json.dumps(os.getpid())

def blas_pool():
    import numpy
    matrix = numpy.ones((256, 256))
    return json.dumps(float((matrix @ matrix).sum()))

def torch_pools():
    import torch
    weights = torch.ones((256, 256), requires_grad=True)
    (weights @ weights).sum().backward()  # intra-op pool and autograd's threads
    return json.dumps(float(weights.grad.sum()))

def pid():
    return json.dumps(os.getpid())
"""


def _program(name: str, *args: object) -> dict:
    return module_program(TRICKS, [(name, list(args))])


def _processes_named(marker: str) -> list[int]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if marker in (process.info["cmdline"] or []):
            found.append(process.pid)
    return found


def _wait_gone(marker: str, seconds: float = 60.0) -> list[int]:
    """Processes named ``marker`` still alive after waiting (generously) for them to die."""
    deadline = time.monotonic() + seconds
    while (left := _processes_named(marker)) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


def _assert_failed_for_leftovers(answer, *expected: str) -> None:
    assert answer.status == 200, answer.body
    body = answer.body
    assert body["status"] == "FAILED" and body["error"]["kind"] == "runtime", body
    for text in expected:
        assert text in body["error"]["message"], body


THREAD_TRICKS = [
    ("raw_c_thread", "running native code"),
    ("raw_python_thread", "<thread running spin>"),
    ("unlisted_thread", "kcoral-test-unlisted"),
]


@pytest.mark.parametrize("sandbox_mode", SANDBOXES)
@pytest.mark.parametrize(("trick", "named"), THREAD_TRICKS)
def test_a_session_program_that_hides_a_thread_from_threading_fails_and_ends_its_session(
    server_factory, sandbox_mode: str, trick: str, named: str
) -> None:
    server = server_factory("--sandbox", sandbox_mode)
    sid = create_session(server.url).body["session_id"]
    answer = run_in(server.url, sid, _program(trick))
    _assert_failed_for_leftovers(answer, "left threads running", named)
    record = run_in(server.url, sid, _program("pid"))
    assert record.status == 410 and record.body["error"]["kind"] == "session_ended"
    assert "left threads or processes running" in record.body["error"]["message"]


@pytest.mark.parametrize("sandbox_mode", SANDBOXES)
def test_a_reused_worker_whose_program_hid_a_thread_is_retired(
    server_factory, sandbox_mode: str
) -> None:
    server = server_factory("--sandbox", sandbox_mode, "--num-workers", "1")
    before = value_of(run_in(server.url, None, _program("pid")), "pid")
    answer = run_in(server.url, None, _program("raw_c_thread"))
    _assert_failed_for_leftovers(answer, "running native code", "worker was retired")
    assert value_of(run_in(server.url, None, _program("pid")), "pid") != before


@pytest.mark.parametrize("sandbox_mode", SANDBOXES)
@pytest.mark.parametrize("limits", ["cgroup", "no-cgroup"])
@pytest.mark.parametrize("launch", ["fork", "spawn"])
def test_a_process_that_escapes_the_workers_subreaper_fails_the_program_and_is_killed(
    server_factory, sandbox_mode: str, limits: str, launch: str
) -> None:
    # without limits no worker cgroup exists: the process tree above the worker finds it
    # (the launcher that forked it, or the supervisor or bwrap of a spawned one)
    args = ["--worker-memory-limit-bytes", "0", "--worker-process-limit", "0"]
    server = server_factory(
        "--sandbox",
        sandbox_mode,
        *(args if limits == "no-cgroup" else []),
        env={LAUNCH_ENV: launch},
    )
    marker = f"kcoral-escapee-{uuid.uuid4().hex[:12]}"
    sid = create_session(server.url).body["session_id"]
    answer = run_in(server.url, sid, _program("escaped_process", marker))
    _assert_failed_for_leftovers(answer, "left background processes running")
    assert _wait_gone(marker) == []
    record = run_in(server.url, sid, _program("pid"))
    assert record.status == 410 and "left threads or processes" in record.body["error"]["message"]
    # the server keeps serving
    assert value_of(run_in(server.url, None, _program("pid")), "pid")


def test_an_honest_program_is_not_blamed_for_an_orphan_of_another_workers_program(
    server_factory, tmp_path
) -> None:
    # one shared launcher without cgroups: both workers' orphans become its children
    server = server_factory(
        "--num-workers", "2", "--worker-memory-limit-bytes", "0", "--worker-process-limit", "0"
    )
    marker = f"kcoral-escapee-{uuid.uuid4().hex[:12]}"
    flag = tmp_path / "flag"
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        escaping = pool.submit(
            run_in, server.url, None, _program("escape_and_wait", marker, str(flag))
        )
        deadline = time.monotonic() + 60
        while not _processes_named(marker):
            assert time.monotonic() < deadline and not escaping.done(), "no orphan appeared"
            time.sleep(0.05)
        honest = run_in(server.url, None, _program("pid"))
        assert value_of(honest, "pid")  # COMPLETED on the other worker
        assert _processes_named(marker)  # not killed by the other worker's check
        flag.write_text("go")
        _assert_failed_for_leftovers(escaping.result(timeout=120), "left background processes")
    assert _wait_gone(marker) == []


@pytest.mark.parametrize("sandbox_mode", SANDBOXES)
@pytest.mark.parametrize(
    ("library", "function", "value"),
    [("numpy", "blas_pool", float(256**3)), ("torch", "torch_pools", float(2 * 256**3))],
)
def test_native_threads_a_library_keeps_do_not_fail_a_session_program(
    server_factory, sandbox_mode: str, library: str, function: str, value: float
) -> None:
    pytest.importorskip(library, reason=f"{library} provides the thread pools this test starts")
    server = server_factory("--sandbox", sandbox_mode)
    sid = create_session(server.url).body["session_id"]
    first = run_in(server.url, sid, _program(function))
    assert value_of(first, function) == value
    pid = value_of(run_in(server.url, sid, _program("pid")), "pid")
    assert value_of(run_in(server.url, sid, _program("pid")), "pid") == pid
    record = request(server.url, "GET", f"/v1/sessions/{sid}").body
    assert record["state"] == "IDLE" and record["programs"] == 3, record
