"""Jobs end to end (EXTENSIONS §5): real servers, the real client, real worker processes.

Liveness is proven by order (an output event observed while the program still waits for a
file the test creates afterwards), never by wall-clock thresholds.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import socket
import threading
from pathlib import Path

import pytest
from job_helpers import alive, module_program
from waiting import wait_for, wait_for_file

import kcoral
from kcoral.connection.event_stream import JobEvent
from kcoral.errors import KCoralError

WAIT_FOR_FILE = """
import os, time
def f(marker, go):
    print("first", flush=True)
    open(marker, "w").close()
    while not os.path.exists(go):
        time.sleep(0.01)
    print("second")
    return 7
"""

SLEEP = """
import os, subprocess, time
def f(pids, seconds):
    child = subprocess.Popen(["sleep", str(seconds)])
    with open(pids + ".tmp", "w") as handle:
        handle.write(f"{os.getpid()} {child.pid} {os.getcwd()}")
    os.rename(pids + ".tmp", pids)
    time.sleep(seconds)
"""

UTF8_SPLIT = """
import os, sys, time
def f(n):
    for i in range(n):
        # one character written in two halves: the halves may land in different polls
        os.write(1, b"<\\xc3")
        time.sleep(0.03)
        os.write(1, b"\\xa9" + f"{i}>".encode())
        sys.stderr.write(f"e{i}")
    print("\\u4e2d\\u6587" * 3)
    return n
"""


def _events_of(job: kcoral.jobs.Job) -> list[JobEvent]:
    return list(job.events(heartbeats=True))


def _text(events: list[JobEvent], stream: str) -> str:
    return "".join(event.text for event in events if event.kind == stream)


def test_output_arrives_while_the_program_is_still_running(kcoral_server, tmp_path: Path) -> None:
    marker, go = tmp_path / "marker", tmp_path / "go"
    with kcoral.Client(kcoral_server.url) as client:
        assert "jobs" in client.info()["features"]
        job = client.submit(module_program(WAIT_FOR_FILE, "f", str(marker), str(go)))
        seen: list[JobEvent] = []
        for event in job.events():
            seen.append(event)
            if not go.exists() and event.kind == "stdout" and "first" in _text(seen, "stdout"):
                # The program cannot end before this file exists: output came mid-run.
                assert job.status()["status"] == "RUNNING"
                go.touch()
        assert seen[-1].finished and seen[-1].data["status"] == "COMPLETED"
        assert _text(seen, "stdout") == "first\nsecond\n"
        phases = [e.data["phase"] for e in seen if e.kind == "phase"]
        assert phases[:2] == ["queued", "assigned"]
        assert [e.data["op"] for e in seen if e.data.get("phase") == "instruction"] == [
            "upload",
            "get_function",
            "run",
            "return",
        ]
        ids = [event.id for event in seen]
        assert ids == sorted(ids) and len(set(ids)) == len(ids)
        result = job.result()
        assert result.results["r"] == 7 and result.stdout == "first\nsecond\n"
        state = job.status()
        assert state["status"] == "COMPLETED" and state["worker_id"] == "cpu/w0"
        assert all(state[k] is not None for k in ("queue_ms", "elapsed_ms", "finished_at"))


def test_reconnecting_with_last_event_id_loses_and_duplicates_nothing(
    kcoral_server, tmp_path: Path
) -> None:
    with kcoral.Client(kcoral_server.url) as client:
        job = client.submit(module_program(UTF8_SPLIT, "f", 20))
        first = []
        for event in job.events():
            first.append(event)
            if len(first) == 8:
                break  # the stream is dropped here
        rest = list(job.events(last_event_id=first[-1].id))
        everything = _events_of(job)  # a full replay after the end
    assert [e.id for e in first + rest] == [e.id for e in everything if e.kind != "heartbeat"]
    assert first + rest == [e for e in everything if e.kind != "heartbeat"]


def test_a_last_event_id_too_long_to_be_ours_replays_the_whole_stream(kcoral_server) -> None:
    """A caller chooses the header: 5000 digits once reached ``int()``'s digit limit and
    answered 500 with a traceback; such a value is no id this server sent, so it counts as
    absent."""
    with kcoral.Client(kcoral_server.url) as client:
        job = client.submit(module_program("def f():\n    print('hi')\n    return 1\n", "f"))
        job.result()
        path = f"/v1/jobs/{job.id}/events"
        full = _get(kcoral_server.url, path)
        connection = _connection(kcoral_server.url)
        try:
            for hostile in ("9" * 5000, "1" * 19):
                connection.request("GET", path, headers={"Last-Event-ID": hostile})
                answer = connection.getresponse()
                assert (answer.status, answer.read()) == full, hostile
        finally:
            connection.close()
    assert full[0] == 200 and b'"phase":"finished"' in full[1]


def test_a_stream_that_drops_is_reopened_transparently(kcoral_server, tmp_path: Path) -> None:
    marker, go = tmp_path / "marker", tmp_path / "go"
    with CuttingProxy(kcoral_server.url) as proxy, kcoral.Client(proxy.url) as client:
        job = client.submit(module_program(WAIT_FOR_FILE, "f", str(marker), str(go)))
        wait_for_file(marker, 60.0)
        go.touch()
        seen = list(job.events())
        assert proxy.cuts == 1  # the first event stream was cut mid-way
        assert seen == [e for e in _events_of(job) if e.kind != "heartbeat"]
        assert _text(seen, "stdout") == "first\nsecond\n"


class CuttingProxy:
    """A TCP proxy that cuts the first event stream it carries after a few hundred bytes."""

    CUT_AFTER = 400

    def __init__(self, url: str) -> None:
        self.upstream = url.split("://", 1)[1].rsplit(":", 1)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}"
        self.cuts = 0
        self.lock = threading.Lock()

    def __enter__(self) -> CuttingProxy:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.listener.close()

    def _accept(self) -> None:
        while True:
            try:
                downstream, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection((self.upstream[0], int(self.upstream[1])))
            threading.Thread(target=self._pump, args=(downstream, upstream, False)).start()
            threading.Thread(target=self._pump, args=(upstream, downstream, True)).start()

    def _pump(self, source: socket.socket, target: socket.socket, answers: bool) -> None:
        sent = 0
        streaming = False
        try:
            while True:
                data = source.recv(65536)
                if not data:
                    break
                if answers and b"text/event-stream" in data:
                    with self.lock:
                        streaming = self.cuts == 0
                        self.cuts += streaming
                if streaming and sent + len(data) > self.CUT_AFTER:
                    target.sendall(data[: self.CUT_AFTER - sent])
                    break
                target.sendall(data)
                sent += len(data)
        except OSError:
            pass
        for sock in (source, target):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


def test_an_unknown_job_is_404_not_found(kcoral_server) -> None:
    with kcoral.Client(kcoral_server.url) as client:
        for call in (
            lambda job: job.status(),
            lambda job: job.cancel(),
            lambda job: job.result(),
            lambda job: list(job.events()),
        ):
            with pytest.raises(KCoralError) as caught:
                call(client.job("00000000-0000-4000-8000-000000000000"))
            assert caught.value.status_code == 404 and caught.value.kind == "not_found"


def test_a_job_result_equals_what_execute_returns_for_json_and_multipart(kcoral_server) -> None:
    source = "def f(n):\n    print('out', n)\n    return {'n': n, 'b': bytes(range(n))}\n"
    with kcoral.Client(kcoral_server.url) as client:
        for program in (
            module_program("def f():\n    print('hi')\n    return [1, 'x', None]\n", "f"),
            module_program(source, "f", 16),
        ):
            direct = client.execute(program)
            via_job = client.submit(program).result()
            assert via_job.status == direct.status == "COMPLETED"
            assert via_job.results == direct.results
            assert (via_job.stdout, via_job.stderr) == (direct.stdout, direct.stderr)
        failing = module_program("def f():\n    raise ValueError('no')\n", "f")
        direct, via_job = client.execute(failing), client.submit(failing).result()
        assert via_job.status == direct.status == "FAILED"
        assert via_job.error["message"] == direct.error["message"]


def test_a_job_submission_goes_through_cache_negotiation(kcoral_server) -> None:
    program = kcoral.Program()
    data = program.upload(kind="bytes", value=b"z" * 1000, id="data")
    program.return_(key="data", value=data)
    with kcoral.Client(kcoral_server.url) as client:
        assert client.submit(program).result().results["data"] == b"z" * 1000
    finishes = [e for e in kcoral_server.events() if e["event"] == "request_finished"]
    assert [e["finish_reason"] for e in finishes] == ["cache_miss", "completed"]


def test_an_invalid_job_is_refused_like_execute(kcoral_server) -> None:
    with kcoral.Client(kcoral_server.url) as client:
        with pytest.raises(KCoralError) as caught:
            client.submit(kcoral.Program(), gpu_count=1)
    assert caught.value.status_code == 400 and caught.value.kind == "parse"
    assert json.loads(_get(kcoral_server.url, "/v1/jobs")[1]) == []


@pytest.mark.parametrize("kcoral_server", [["--num-workers", "1"]], indirect=True)
def test_a_queued_job_can_be_cancelled(kcoral_server, tmp_path: Path) -> None:
    with kcoral.Client(kcoral_server.url) as client:
        first = client.submit(module_program(SLEEP, "f", str(tmp_path / "pids"), 60))
        wait_for_file(tmp_path / "pids", 60.0)
        queued = client.submit(module_program("def f():\n    return 1\n", "f"))
        assert queued.status()["status"] == "QUEUED"
        assert queued.status()["queue_position"] == 0
        assert queued.cancel()["status"] == "CANCELLED"
        assert queued.cancel()["status"] == "CANCELLED"  # idempotent
        with pytest.raises(KCoralError) as caught:
            queued.result()
        assert caught.value.status_code == 409 and caught.value.kind == "cancelled"
        assert first.status()["status"] == "RUNNING"
        assert first.cancel()["status"] == "CANCELLED"
        assert client.execute(module_program("def f():\n    return 2\n", "f")).results["r"] == 2


@pytest.mark.parametrize(
    "kcoral_server",
    [["--device", "fake-gpu", "--fake-gpu-count", "1", "--workers-per-gpu", "2"]],
    indirect=True,
)
def test_cancelling_a_running_job_kills_its_process_tree_and_frees_the_lease(
    kcoral_server, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    with kcoral.Client(kcoral_server.url) as client:
        job = client.submit(module_program(SLEEP, "f", str(pids), 120))
        worker_pid, child_pid, workspace = wait_for_file(pids, 60.0).split(" ", 2)
        assert alive(int(worker_pid)) and alive(int(child_pid))
        status, body = _get(kcoral_server.url, f"/v1/jobs/{job.id}/result")
        assert status == 409 and json.loads(body)["error"]["kind"] == "not_finished"
        with pytest.raises(TimeoutError):
            job.result(timeout=0.2)
        state = job.cancel()
        assert state["status"] == "CANCELLED" and state["error_kind"] == "cancelled"
        assert not alive(int(worker_pid)) and not alive(int(child_pid))
        assert not Path(workspace).exists()
        phases = [e.data["phase"] for e in job.events() if e.kind == "phase"]
        assert "lease_wait" in phases and "lease_held" in phases
        assert phases[-1] == "finished"
        # The next program needs the GPU lease: it was released with the killed worker.
        after = client.execute(module_program("def f():\n    return 3\n", "f"))
        assert after.results["r"] == 3
    retired = [e for e in kcoral_server.events() if e["event"] == "worker_retired"]
    assert [e["reason"] for e in retired] == ["cancelled"]
    finished = [e for e in kcoral_server.events() if e["event"] == "request_finished"]
    assert finished[0]["finish_reason"] == "cancelled"


@pytest.mark.parametrize(
    "kcoral_server", [["--job-retention-seconds", "0.5", "--num-workers", "1"]], indirect=True
)
def test_a_finished_job_expires_after_its_retention_time(kcoral_server) -> None:
    with kcoral.Client(kcoral_server.url) as client:
        job = client.submit(module_program("def f():\n    return 1\n", "f"))
        job.wait()

        def expired() -> bool:
            status, body = _get(kcoral_server.url, f"/v1/jobs/{job.id}")
            return status == 404 and json.loads(body)["error"]["kind"] == "job_expired"

        wait_for(expired, "expiry", 60.0)
        with pytest.raises(KCoralError) as caught:
            job.result()
        assert caught.value.kind == "job_expired"


@pytest.mark.parametrize(
    # each job counts about 7.3 KiB (3 KiB of record, its output twice, its events)
    "kcoral_server",
    [["--job-retention-bytes", "16000", "--num-workers", "1"]],
    indirect=True,
)
def test_the_oldest_finished_jobs_go_first_when_retention_bytes_run_out(kcoral_server) -> None:
    program = module_program("def f():\n    print('x' * 1500)\n    return 1\n", "f")
    with kcoral.Client(kcoral_server.url) as client:
        jobs = []
        for _ in range(4):
            jobs.append(client.submit(program))
            jobs[-1].wait()
        kinds = []
        for job in jobs:
            status, body = _get(kcoral_server.url, f"/v1/jobs/{job.id}")
            kinds.append(
                json.loads(body)["status"] if status == 200 else json.loads(body)["error"]["kind"]
            )
    assert kinds[-1] == "COMPLETED" and kinds[0] == "job_expired"
    kept = kinds.index("COMPLETED")
    assert kinds[:kept] == ["job_expired"] * kept and set(kinds[kept:]) == {"COMPLETED"}


@pytest.mark.parametrize(
    # a small job counts about 5.4 KiB, the large one about 21 KiB
    "kcoral_server",
    [["--job-retention-bytes", "14000", "--num-workers", "1"]],
    indirect=True,
)
def test_a_job_larger_than_the_retention_bound_goes_alone(kcoral_server) -> None:
    """A finished job that alone passes ``--job-retention-bytes`` used to take every older
    finished job (of every owner) with it before going itself; now only it expires."""
    small = module_program("def f():\n    print('x' * 500)\n    return 1\n", "f")
    large = module_program("def f():\n    print('y' * 9000)\n    return 2\n", "f")
    with kcoral.Client(kcoral_server.url) as client:
        kept = [client.submit(small) for _ in range(2)]
        for job in kept:
            job.wait()
        too_large = client.submit(large)
        with contextlib.suppress(KCoralError):  # it may expire before its stream ends
            too_large.wait()

        def kind(job: kcoral.jobs.Job) -> str:
            status, body = _get(kcoral_server.url, f"/v1/jobs/{job.id}")
            decoded = json.loads(body)
            return decoded["status"] if status == 200 else decoded["error"]["kind"]

        wait_for(lambda: kind(too_large) == "job_expired", "the large job's expiry", 60.0)
        assert [kind(job) for job in kept] == ["COMPLETED", "COMPLETED"]
        assert [job.result()["r"] for job in kept] == [1, 1]


@pytest.mark.parametrize("kcoral_server", [["--num-workers", "2"]], indirect=True)
def test_a_hundred_concurrent_jobs_with_open_streams_all_deliver_complete_output(
    kcoral_server,
) -> None:
    count = 100
    with kcoral.Client(kcoral_server.url) as client:
        jobs = [client.submit(module_program(UTF8_SPLIT, "f", 3)) for _ in range(count)]
        streamed: dict[str, list[JobEvent]] = {}
        errors: list[BaseException] = []

        def follow(job: kcoral.jobs.Job) -> None:
            try:
                streamed[job.id] = list(job.events())
            except BaseException as exc:  # reported below
                errors.append(exc)

        threads = [threading.Thread(target=follow, args=(job,)) for job in jobs]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(300)
        assert not errors
        expected = "".join(f"<\u00e9{i}>" for i in range(3)) + "\u4e2d\u6587" * 3 + "\n"
        for job in jobs:
            events = streamed[job.id]
            result = job.result()
            assert result.results["r"] == 3
            assert _text(events, "stdout") == result.stdout == expected
            assert _text(events, "stderr") == result.stderr == "e0e1e2"
            assert events[-1].data == {"phase": "finished", "status": "COMPLETED", **UNCUT}
        listed = json.loads(_get(kcoral_server.url, "/v1/jobs")[1])
        assert [j["job_id"] for j in listed] == [job.id for job in reversed(jobs)]


#: a finished event's output fields when neither stream passed the output limit
UNCUT = {"stdout_truncated": False, "stderr_truncated": False}


def test_output_beyond_the_limit_is_not_streamed_and_matches_the_result(kcoral_server) -> None:
    source = "def f():\n    print('\\u00e9' * 10)\n"
    with kcoral.Client(kcoral_server.url) as client:
        job = client.submit(module_program(source, "f", returns=False), output_limit_bytes=5)
        events = list(job.events())
        result = job.result()
    assert result.stdout_truncated
    assert _text(events, "stdout") == result.stdout == "\u00e9\u00e9\ufffd"
    # the stream says so, as the result does: a live view can mark where it was cut
    assert events[-1].data == {
        "phase": "finished",
        "status": "COMPLETED",
        "stdout_truncated": True,
        "stderr_truncated": False,
    }


def test_a_burst_of_output_at_the_end_arrives_in_events_of_at_most_a_read_each(
    kcoral_server,
) -> None:
    # 12 MiB written at once, then the program ends: the final drain sent the whole rest as
    # one event (up to an output limit of text on one ``data:`` line); now a read at most.
    source = "import sys\ndef f():\n    sys.stdout.write('\u00e9' * (6 << 20))\n"
    with kcoral.Client(kcoral_server.url) as client:
        job = client.submit(module_program(source, "f", returns=False), output_limit_bytes=16 << 20)
        events = list(job.events())
        result = job.result()
    chunks = [e.data["text"] for e in events if e.kind == "stdout"]
    assert max(len(chunk.encode()) for chunk in chunks) <= (4 << 20) + 3
    assert "".join(chunks) == result.stdout == "\u00e9" * (6 << 20)


def test_a_disconnected_execute_client_has_its_program_killed(
    kcoral_server, tmp_path: Path
) -> None:
    from kcoral.connection.negotiation import ExecuteNegotiation

    pids = tmp_path / "pids"
    attempt = ExecuteNegotiation(module_program(SLEEP, "f", str(pids), 120)).first_attempt()
    connection = _connection(kcoral_server.url)
    connection.request("POST", "/execute", body=attempt.body(), headers=attempt.headers)
    worker_pid, child_pid, workspace = wait_for_file(pids, 60.0).split(" ", 2)
    connection.close()
    wait_for(lambda: not alive(int(child_pid)) and not alive(int(worker_pid)), "the kill", 60.0)
    wait_for(lambda: not Path(workspace).exists(), "workspace removal", 60.0)

    def logged() -> bool:
        return any(
            e["event"] == "request_finished" and e.get("finish_reason") == "client_disconnected"
            for e in kcoral_server.events()
        )

    wait_for(logged, "request_finished client_disconnected", 60.0)
    with kcoral.Client(kcoral_server.url) as client:
        assert client.execute(module_program("def f():\n    return 4\n", "f")).results["r"] == 4


def test_a_request_refused_before_its_body_was_read_says_connection_close(
    kcoral_server,
) -> None:
    for path in ("/execute", "/v1/jobs"):
        connection = _connection(kcoral_server.url)
        connection.putrequest("POST", path)
        connection.putheader("Content-Type", "multipart/form-data; boundary=x")
        connection.putheader("Content-Length", str(10**12))
        connection.endheaders()
        answer = connection.getresponse()
        answer.read()
        assert answer.status == 413
        assert answer.headers["Connection"] == "close"
        connection.close()
    _status, body = _get(kcoral_server.url, "/v1/info")
    assert "jobs" in json.loads(body)["features"]


def _connection(url: str) -> http.client.HTTPConnection:
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    return http.client.HTTPConnection(host, int(port), timeout=60)


def _get(url: str, path: str) -> tuple[int, bytes]:
    connection = _connection(url)
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        return answer.status, answer.read()
    finally:
        connection.close()


def test_on_shutdown_queued_jobs_end_as_busy_errors_and_running_ones_finish(
    server_factory, tmp_path: Path
) -> None:
    server = server_factory("--num-workers", "1")
    marker, go = tmp_path / "marker", tmp_path / "go"
    with kcoral.Client(server.url) as client:
        running = client.submit(module_program(WAIT_FOR_FILE, "f", str(marker), str(go)))
        wait_for_file(marker, 60.0)
        queued = client.submit(module_program("def f():\n    return 1\n", "f"))
        streams: dict[str, list[JobEvent]] = {}
        threads = [
            threading.Thread(target=lambda j=job: streams.__setitem__(j.id, list(j.events())))
            for job in (running, queued)
        ]
        for thread in threads:
            thread.start()
        server.process.send_signal(signal.SIGTERM)
        wait_for(lambda: queued.status()["status"] == "ERROR", "the queued job ending", 60.0)
        assert queued.status()["error_kind"] == "busy"
        with pytest.raises(KCoralError) as caught:
            queued.result()
        assert caught.value.status_code == 503 and caught.value.kind == "busy"
        go.touch()
        for thread in threads:
            thread.join(60)
    assert server.process.wait(60) == 0
    assert streams[queued.id][-1].data == {"phase": "finished", "status": "ERROR", **UNCUT}
    assert streams[running.id][-1].data == {"phase": "finished", "status": "COMPLETED", **UNCUT}
    assert _text(streams[running.id], "stdout") == "first\nsecond\n"


def test_the_async_client_submits_streams_and_cancels_jobs(kcoral_server, tmp_path: Path) -> None:
    import asyncio

    async def scenario() -> None:
        async with kcoral.AsyncClient(kcoral_server.url) as client:
            job = await client.submit(module_program(UTF8_SPLIT, "f", 2))
            events = [event async for event in job.events()]
            result = await job.result()
            assert _text(events, "stdout") == result.stdout and result.results["r"] == 2
            again = client.job(job.id)
            assert (await again.status())["status"] == "COMPLETED"
            sleeper = await client.submit(module_program(SLEEP, "f", str(tmp_path / "p"), 60))
            with pytest.raises(TimeoutError):
                await sleeper.result(timeout=0.2)
            assert (await sleeper.cancel())["status"] == "CANCELLED"

    asyncio.run(scenario())
