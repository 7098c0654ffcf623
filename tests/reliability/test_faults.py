"""Faults against real servers: killed, stopped and forking workers, clients that go away,
idle bodies, broken disk caches and a front-end killed with requests in flight.

After each fault the server is healthy and holds no more descriptors (memfds are descriptors
of the front-end), descendant processes or ``kcoral-program-*`` workspaces than before.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
from reliability_support import (
    TRIVIAL,
    Answer,
    address,
    assert_no_leaks,
    check_documented,
    check_error,
    check_healthy,
    descendants,
    exchange,
    execute,
    execute_body,
    is_alive,
    launch,
    multipart_type,
    request_bytes,
    sha256,
    warm,
    workspaces,
)
from waiting import wait_until

pytestmark = pytest.mark.slow

HANG = """
import os, time
def hang(marker, seconds):
    print("working", flush=True)
    with open(marker + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(marker + ".tmp", marker)
    time.sleep(seconds)
    return 1
"""
CRASH_MESSAGE = "worker exited while executing the instruction"


def hang_program(marker: Path, seconds: float, **options) -> dict:
    return {
        "instructions": [
            {"op": "upload", "id": "m", "kind": "module", "source": HANG},
            {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": "hang"},
            {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": [str(marker), seconds]},
            {"op": "return", "key": "value", "value": {"$ref": "r"}},
        ],
        "options": options,
    }


class InBackground:
    """Runs one request in a thread; ``result()`` is its answer or its exception."""

    def __init__(self, function, *args) -> None:
        self.outcome: Answer | BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(function, *args), daemon=True)
        self.thread.start()

    def _run(self, function, *args) -> None:
        try:
            self.outcome = function(*args)
        except BaseException as exc:
            self.outcome = exc

    def result(self, timeout: float = 120.0):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "request did not finish"
        return self.outcome


def worker_pid(marker: Path) -> int:
    assert wait_until(marker.exists, 60), "the program never started"
    return int(marker.read_text())


def test_a_worker_killed_with_sigkill_mid_instruction_fails_it_and_leaks_nothing(
    watched_server, tmp_path
) -> None:
    server = watched_server("--num-workers", "2")
    marker = tmp_path / "pid"
    running = InBackground(execute, server.url, hang_program(marker, 60, timeout_seconds=120))
    os.kill(worker_pid(marker), signal.SIGKILL)
    answer = running.result()
    check_documented(answer)
    assert answer.body["status"] == "FAILED"
    error = answer.body["error"]
    assert (error["kind"], error["message"], error["instruction_index"]) == (
        "runtime",
        CRASH_MESSAGE,
        2,
    )
    assert error["traceback"] == "" and answer.body["stdout"] == "working\n"
    check_healthy(server.url)
    assert_no_leaks(server.pid, server.temp_dir, server.baseline)


def test_a_worker_stopped_with_sigstop_times_out_and_is_replaced(watched_server, tmp_path) -> None:
    server = watched_server("--num-workers", "2", "--worker-termination-grace-seconds", "1")
    marker = tmp_path / "pid"
    running = InBackground(execute, server.url, hang_program(marker, 60, timeout_seconds=2))
    pid = worker_pid(marker)
    os.kill(pid, signal.SIGSTOP)
    try:
        answer = running.result()
        check_error(answer, 504, "timeout")
        assert answer.body["error"]["message"].startswith("execution timed out after")
        assert wait_until(lambda: not is_alive(pid), 20), "the stopped worker survived"
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    check_healthy(server.url)
    assert_no_leaks(server.pid, server.temp_dir, server.baseline)


FORKER = """
import os, subprocess, time
def spawn(directory):
    children = [
        subprocess.Popen(["sleep", "600"]),
        subprocess.Popen(["sleep", "600"], start_new_session=True),
    ]
    for child in children:
        open(os.path.join(directory, str(child.pid)), "w").close()
    first = os.fork()
    if first == 0:  # a classic daemon: double fork and setsid
        os.setsid()
        if os.fork() == 0:
            open(os.path.join(directory, str(os.getpid())), "w").close()
            time.sleep(600)
        os._exit(0)
    os.waitpid(first, 0)
    while len(os.listdir(directory)) < 3:
        time.sleep(0.01)
    return "spawned"

def spawn_and_die(directory):
    spawn(directory)
    os._exit(0)
"""


def forker_program(function: str, directory: Path) -> dict:
    return {
        "instructions": [
            {"op": "upload", "id": "m", "kind": "module", "source": FORKER},
            {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": function},
            {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": [str(directory)]},
            {"op": "return", "key": "value", "value": {"$ref": "r"}},
        ],
        "options": {"timeout_seconds": 60},
    }


def _spawned(directory: Path) -> list[int]:
    return [int(name) for name in os.listdir(directory)]


def _kill_all(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def test_a_program_that_leaves_children_fails_and_they_are_all_killed(
    watched_server, tmp_path
) -> None:
    server = watched_server("--num-workers", "2")
    directory = tmp_path / "children"
    directory.mkdir()
    try:
        answer = execute(server.url, forker_program("spawn", directory))
        check_documented(answer)
        assert answer.body["status"] == "FAILED", answer.body
        assert answer.body["error"]["message"] == (
            "program left background processes running; they were terminated"
        )
        assert answer.body["results"] == {"value": {"type": "string", "value": "spawned"}}
        pids = _spawned(directory)
        assert len(pids) == 3
        assert wait_until(lambda: not any(is_alive(p) for p in pids), 20), pids
    finally:
        _kill_all(_spawned(directory))
    check_healthy(server.url)
    assert_no_leaks(server.pid, server.temp_dir, server.baseline)


def test_a_worker_that_exits_with_forked_children_fails_its_instruction_at_once(
    watched_server, tmp_path
) -> None:
    server = watched_server("--num-workers", "2")
    directory = tmp_path / "children"
    directory.mkdir()
    program = forker_program("spawn_and_die", directory)
    program["options"]["timeout_seconds"] = 8
    try:
        answer = execute(server.url, program)
        check_documented(answer)
        assert answer.status == 200, answer.body
        assert answer.body["error"]["message"] == f"{CRASH_MESSAGE}: it exited with status 0"
    finally:
        _kill_all(_spawned(directory))


def test_children_of_a_worker_that_exits_abruptly_are_killed(watched_server, tmp_path) -> None:
    server = watched_server("--num-workers", "2", "--worker-termination-grace-seconds", "1")
    directory = tmp_path / "children"
    directory.mkdir()
    program = forker_program("spawn_and_die", directory)
    program["options"]["timeout_seconds"] = 5
    try:
        check_documented(execute(server.url, program))
        pids = _spawned(directory)
        assert len(pids) == 3
        assert wait_until(lambda: not any(is_alive(p) for p in pids), 10), [
            p for p in pids if is_alive(p)
        ]
    finally:
        _kill_all(_spawned(directory))


# ------------------------------------------------------------------ clients that go away


def test_clients_that_disconnect_mid_upload_release_their_reserved_bytes(watched_server) -> None:
    limit = 8 << 20
    server = watched_server(
        "--max-request-bytes", str(limit), "--max-inflight-request-bytes", str(limit)
    )
    for _ in range(5):
        head = request_bytes("POST", "/execute", None, [("Content-Type", multipart_type())])
        head = head.replace(b"\r\n\r\n", f"\r\nContent-Length: {limit - 100}\r\n\r\n".encode())
        with socket.create_connection(address(server.url)) as sock:
            sock.sendall(head + b"x" * (1 << 20))
            time.sleep(0.2)  # let the server admit the body and reserve its bytes
    # A leaked reservation would turn this large upload into a 503.
    big = b"\x01" * (limit - (1 << 20))
    program = {
        "instructions": [
            {"op": "upload", "kind": "bytes", "id": "b", "blob": sha256(big)},
            {"op": "return", "key": "b", "value": {"$ref": "b"}},
        ]
    }
    answer = execute(server.url, program, [big])
    check_documented(answer)
    assert answer.body["status"] == "COMPLETED", answer.body
    assert answer.parts["return:0"] == big
    check_healthy(server.url)
    assert_no_leaks(server.pid, server.temp_dir, server.baseline)


def test_a_client_that_disconnects_mid_upload_has_its_request_logged_as_finished(
    watched_server,
) -> None:
    """The soak found such requests logged ``request_received`` and never finished: a log
    that says a request is still under way, and a metrics count that never saw it."""
    server = watched_server()
    declared = 2 << 20
    head = request_bytes("POST", "/execute", None, [("Content-Type", multipart_type())])
    head = head.replace(b"\r\n\r\n", f"\r\nContent-Length: {declared}\r\n\r\n".encode())
    with socket.create_connection(address(server.url)) as sock:
        sock.sendall(head + b"x" * (1 << 20))

    def records() -> list[dict]:
        events = server.events()
        gone = {
            e["request_id"]
            for e in events
            if e["event"] == "request_received" and e.get("content_length") == declared
        }
        return [e for e in events if e.get("request_id") in gone]

    assert wait_until(lambda: len(records()) >= 2, 10), records()
    received, end = records()
    assert received["event"] == "request_received"
    assert end["event"] == "request_finished"
    assert (end["http_status"], end["finish_reason"]) == (499, "client_disconnected")
    check_healthy(server.url)
    assert_no_leaks(server.pid, server.temp_dir, server.baseline)


BIG_RETURN = "def big(n):\n    return b'x' * n\n"


def test_clients_that_disconnect_mid_response_leave_nothing_behind(watched_server) -> None:
    server = watched_server()
    program = {
        "instructions": [
            {"op": "upload", "id": "m", "kind": "module", "source": BIG_RETURN},
            {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": "big"},
            {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": [64 << 20]},
            {"op": "return", "key": "value", "value": {"$ref": "r"}},
        ]
    }
    raw = request_bytes(
        "POST", "/execute", execute_body(program), [("Content-Type", multipart_type())]
    )
    for _ in range(3):
        with socket.create_connection(address(server.url), timeout=60) as sock:
            sock.sendall(raw)
            received = sock.recv(4096)
            assert received.startswith(b"HTTP/1.1 200"), received[:200]
    check_healthy(server.url)
    assert_no_leaks(server.pid, server.temp_dir, server.baseline)
    finished = [e for e in server.events() if e["event"] == "request_finished"]
    assert all(e["http_status"] == 200 for e in finished), finished


def test_a_client_that_disconnects_while_its_program_runs_cancels_it(
    watched_server, tmp_path
) -> None:
    server = watched_server("--num-workers", "2", "--worker-termination-grace-seconds", "1")
    marker = tmp_path / "pid"
    raw = request_bytes(
        "POST",
        "/execute",
        execute_body(hang_program(marker, 12, timeout_seconds=60)),
        [("Content-Type", multipart_type())],
    )
    with socket.create_connection(address(server.url)) as sock:
        sock.sendall(raw)
        pid = worker_pid(marker)
    assert wait_until(lambda: not is_alive(pid), 8), "the abandoned program kept running"
    finished = [e for e in server.events() if e["event"] == "request_finished"]
    assert finished[-1]["finish_reason"] == "client_disconnected"


def _idle_upload(url: str, declared: int) -> socket.socket:
    sock = socket.create_connection(address(url))
    head = request_bytes("POST", "/execute", None, [("Content-Type", multipart_type())])
    head = head.replace(b"Connection: close\r\n", b"")
    head = head.replace(b"\r\n\r\n", f"\r\nContent-Length: {declared}\r\n\r\n".encode())
    sock.sendall(head + b"--")
    return sock


def test_idle_uploads_hold_their_reservation_but_do_not_block_small_requests(
    watched_server,
) -> None:
    limit = 1 << 20
    server = watched_server("--max-request-bytes", str(limit))  # in-flight budget: 2 MiB
    idle = [_idle_upload(server.url, 1000) for _ in range(20)]
    try:
        time.sleep(0.3)
        check_healthy(server.url)
    finally:
        for sock in idle:
            sock.close()
    assert_no_leaks(server.pid, server.temp_dir, server.baseline)


def test_concurrent_uploads_beyond_the_in_flight_budget_get_503_busy(watched_server) -> None:
    limit = 1 << 20
    server = watched_server(
        "--max-request-bytes", str(limit), "--max-inflight-request-bytes", str(limit + limit // 2)
    )
    # Issue 16.7a: a declaration reserves nothing, bytes that arrived do. This upload sends
    # all but 100 bytes of its 1 MiB and stalls: it holds ~1 MiB.
    first = _idle_upload(server.url, limit)
    first.sendall(b"x" * (limit - 102))
    try:
        time.sleep(0.3)
        small = execute(server.url, TRIVIAL)
        # The small request fits (1 MiB + a few hundred bytes <= 1.5 MiB)...
        assert small.body["status"] == "COMPLETED", small.body
        # ...a second large one does not, and is refused before its body is read.
        head = request_bytes("POST", "/execute", None, [("Content-Type", multipart_type())])
        head = head.replace(b"\r\n\r\n", f"\r\nContent-Length: {limit}\r\n\r\n".encode())
        refused = exchange(server.url, head, timeout=30)
        check_error(refused, 503, "busy")
        message = refused.body["error"]["message"]
        assert message.startswith(
            "server saturated: bodies of requests being received and of queued or running "
            "jobs hold "
        ), message
        assert message.endswith(" of --max-inflight-request-bytes (1.5 MiB)"), message
    finally:
        first.close()
    # Once the idle upload is gone its reservation is released.
    assert wait_until(lambda: execute(server.url, TRIVIAL).status == 200, 10)
    assert_no_leaks(server.pid, server.temp_dir, server.baseline)


def test_slowloris_connections_are_closed_by_a_body_timeout(watched_server) -> None:
    """An idle body must not hold a connection (and its in-flight reservation) forever."""
    server = watched_server("--body-timeout-seconds", "2")
    sock = _idle_upload(server.url, 1000)
    sock.settimeout(20)
    try:
        data = sock.recv(65536)  # b"" (closed) or an error answer
        assert data == b"" or data.startswith(b"HTTP/1.1 4"), data[:200]
    finally:
        sock.close()


def test_idle_uploads_cannot_lock_out_other_clients(watched_server) -> None:
    """Two idle uploads declaring max_request_bytes used to reserve the whole default
    in-flight budget (2 x max_request_bytes); since issue 16.7a they hold only the bytes
    they sent, so other clients are served at once."""
    limit = 1 << 20
    server = watched_server("--max-request-bytes", str(limit), "--body-timeout-seconds", "2")
    idle = [_idle_upload(server.url, limit) for _ in range(2)]
    try:
        time.sleep(0.3)
        assert execute(server.url, TRIVIAL).status == 200  # not locked out while they idle
    finally:
        for sock in idle:
            sock.close()


# ------------------------------------------------------------------ disk cache faults

FILE_DATA = os.urandom(1 << 20)
FILE_PROGRAM = {
    "instructions": [
        {"op": "upload", "kind": "file", "path": "data.bin", "blob": sha256(FILE_DATA)},
        {"op": "return", "key": "copy", "kind": "file", "path": "data.bin"},
    ]
}


def _file_round_trips(url: str) -> str:
    """Run the file program with its blob; return the status of a blob-less retry."""
    answer = execute(url, FILE_PROGRAM, [FILE_DATA])
    check_documented(answer)
    assert answer.body["status"] == "COMPLETED", answer.body
    assert answer.parts["return:0"] == FILE_DATA
    again = execute(url, FILE_PROGRAM)
    check_documented(again)
    return again.body["status"]


def test_an_unusable_disk_cache_directory_only_means_misses(watched_server, tmp_path) -> None:
    blocker = tmp_path / "not-a-directory"
    blocker.write_bytes(b"")
    server = watched_server("--disk-cache-dir", str(blocker / "cache"))
    assert _file_round_trips(server.url) == "CACHE_MISS"
    check_healthy(server.url)
    assert_no_leaks(server.pid, server.temp_dir, server.baseline)


@contextlib.contextmanager
def mounted_tmpfs(path: Path, options: str):
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode(errors='replace')}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_a_read_only_disk_cache_only_means_misses(watched_server, tmp_path) -> None:
    with mounted_tmpfs(tmp_path / "ro-cache", "ro,size=1m") as cache:
        server = watched_server("--disk-cache-dir", str(cache))
        assert _file_round_trips(server.url) == "CACHE_MISS"
        check_healthy(server.url)
        assert_no_leaks(server.pid, server.temp_dir, server.baseline)
        server.stop()


def test_a_full_disk_cache_only_means_misses_and_leaves_no_partial_files(
    watched_server, tmp_path
) -> None:
    with mounted_tmpfs(tmp_path / "small-cache", "size=256k") as cache:
        server = watched_server("--disk-cache-dir", str(cache))
        assert _file_round_trips(server.url) == "CACHE_MISS"
        leftovers = [p for p in cache.rglob("*") if p.is_file() and p.stat().st_size > 0]
        assert leftovers == [], leftovers
        check_healthy(server.url)
        assert_no_leaks(server.pid, server.temp_dir, server.baseline)
        server.stop()


def test_a_disk_cache_turned_read_only_at_run_time_keeps_serving_hits(
    watched_server, tmp_path
) -> None:
    with mounted_tmpfs(tmp_path / "cache", "size=8m") as cache:
        server = watched_server("--disk-cache-dir", str(cache))
        assert _file_round_trips(server.url) == "COMPLETED"
        subprocess.run(["mount", "-o", "remount,ro", str(cache)], check=True)
        # Reading still works (the mtime touch fails silently); writing other blobs fails.
        assert _file_round_trips(server.url) == "COMPLETED"
        other = os.urandom(1000)
        program = {
            "instructions": [
                {"op": "upload", "kind": "file", "path": "o", "blob": sha256(other)},
            ]
        }
        assert execute(server.url, program, [other]).body["status"] == "COMPLETED"
        assert execute(server.url, program).body["status"] == "CACHE_MISS"
        check_healthy(server.url)
        assert_no_leaks(server.pid, server.temp_dir, server.baseline)
        server.stop()


# ------------------------------------------------------------------ front-end restart


def test_a_front_end_killed_with_requests_in_flight_restarts_with_its_disk_cache(
    tmp_path,
) -> None:
    directory = tmp_path / "node"
    first = warm(launch(directory, ["--num-workers", "2"]))
    assert _file_round_trips(first.url) == "COMPLETED"
    marker = tmp_path / "pid"
    running = InBackground(execute, first.url, hang_program(marker, 600, timeout_seconds=900))
    busy = worker_pid(marker)
    workers = descendants(first.pid)
    first.process.send_signal(signal.SIGKILL)
    first.process.wait(10)
    try:
        outcome = running.result(30)
        assert isinstance(outcome, (ConnectionError, OSError)) or (
            type(outcome).__module__ == "http.client"
        ), outcome  # a transport error, not an answer
        second = warm(launch(directory, ["--num-workers", "2"]))
        try:
            # The disk cache survived: the blob-less attempt runs at once.
            answer = execute(second.url, FILE_PROGRAM)
            assert answer.body["status"] == "COMPLETED", answer.body
            assert answer.parts["return:0"] == FILE_DATA
            check_healthy(second.url)
        finally:
            second.stop()
        # The old instance's idle workers notice the closed channel and exit.
        idle = [p for p in workers if p != busy]
        assert wait_until(lambda: not any(is_alive(p) for p in idle), 20), [
            p for p in idle if is_alive(p)
        ]
    finally:
        _kill_all([p for p in workers if is_alive(p)])
    # The killed instance could not remove the in-flight request's workspace.
    assert len(workspaces(directory / "tmp")) <= 1


def test_a_busy_worker_does_not_outlive_a_killed_front_end(tmp_path) -> None:
    first = warm(launch(tmp_path / "node", ["--num-workers", "1"]))
    marker = tmp_path / "pid"
    running = InBackground(execute, first.url, hang_program(marker, 600, timeout_seconds=900))
    busy = worker_pid(marker)
    try:
        first.process.send_signal(signal.SIGKILL)
        first.process.wait(10)
        running.result(30)
        assert wait_until(lambda: not is_alive(busy), 10), "the busy worker outlived its front-end"
    finally:
        _kill_all([busy])
