"""Sessions (EXTENSIONS §11) against real servers: state across programs, isolation, the
per-program GPU lease (fake GPUs), the idle timeout, a crashed worker, owners, the drain."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from http_helpers import Response, connection, execute_body, get, module_program, request
from session_requests import create_session, run_in, value_of
from waiting import wait_for

import kcoral

FAKE_GPU = ["--device", "fake-gpu", "--fake-gpu-count", "1", "--workers-per-gpu", "1"]

STATE = """
import json, os
import kcoral.session as session
def put(key, value):
    session.namespace[key] = value
    os.environ["KCORAL_TEST_LEAK"] = "1"
    return json.dumps(sorted(session.namespace))
def take(key):
    return json.dumps([session.namespace.get(key), os.environ.get("KCORAL_TEST_LEAK")])
def pid():
    return json.dumps(os.getpid())
"""

WORK = """
import time
def work(log, seconds):
    start = time.time()
    time.sleep(seconds)
    with open(log, "a") as f:
        f.write(f"{start} {time.time()}\\n")
    return seconds
"""


def _call(url: str, session_id: str, name: str, *args: object) -> Response:
    return run_in(url, session_id, module_program(STATE, [(name, list(args))]))


#: how long a test waits for a session, its program or its job to get somewhere
WAIT_SECONDS = 30.0


def test_state_persists_across_a_sessions_programs_and_the_environment_is_reset(
    kcoral_server,
) -> None:
    created = create_session(kcoral_server.url)
    assert created.status == 201, created.body
    session = created.body
    assert session["state"] == "IDLE" and session["worker_id"].startswith("session/")
    sid = session["session_id"]
    assert value_of(_call(kcoral_server.url, sid, "put", "model", [1, 2]), "put") == ["model"]
    assert value_of(_call(kcoral_server.url, sid, "take", "model"), "take") == [[1, 2], None]
    record = get(kcoral_server.url, f"/v1/sessions/{sid}").body
    assert record["programs"] == 2 and record["state"] == "IDLE"
    info = get(kcoral_server.url, "/v1/info").body
    assert "sessions" in info["features"]
    assert info["sessions"]["active"] == 1 and info["sessions"]["max"] == 1


@pytest.mark.parametrize("kcoral_server", [["--max-sessions", "2"]], indirect=True)
def test_two_sessions_are_isolated_and_stateless_requests_never_see_the_namespace(
    kcoral_server,
) -> None:
    url = kcoral_server.url
    first = create_session(url).body["session_id"]
    second = create_session(url).body["session_id"]
    assert create_session(url).status == 503  # --max-sessions 2
    value_of(_call(url, first, "put", "x", "first"), "put")
    assert value_of(_call(url, second, "take", "x"), "take") == [None, None]
    assert value_of(_call(url, first, "pid"), "pid") != value_of(_call(url, second, "pid"), "pid")
    stateless = run_in(url, None, module_program(STATE, [("take", ["x"])]))
    assert json.loads(stateless.body["results"]["take#0"]["value"]) == [None, None]


@pytest.mark.parametrize("kcoral_server", [FAKE_GPU], indirect=True)
def test_a_session_program_and_a_stateless_request_never_hold_the_gpu_lease_together(
    kcoral_server, tmp_path: Path
) -> None:
    url = kcoral_server.url
    sid = create_session(url, gpu_count=1).body["session_id"]
    log = tmp_path / "log"
    answers: list[Response] = []
    program = module_program(WORK, [("work", [str(log), 0.5])])
    thread = threading.Thread(target=lambda: answers.append(run_in(url, sid, program)))
    thread.start()
    stateless = run_in(url, None, program)
    thread.join()
    assert stateless.body["status"] == "COMPLETED"
    assert answers[0].body["status"] == "COMPLETED"
    (_a_start, a_end), (b_start, _b_end) = sorted(
        tuple(map(float, line.split())) for line in log.read_text().splitlines()
    )
    assert a_end <= b_start  # one after the other, never together
    assert answers[0].body["lease_held_ms"] > 0 and stateless.body["lease_held_ms"] > 0
    leases = [e for e in kcoral_server.events() if e["event"] == "request_finished"]
    assert {e.get("worker_id") for e in leases} >= {"gpu0/w0"}


def test_a_forgotten_session_ends_after_its_idle_timeout(kcoral_server) -> None:
    url = kcoral_server.url
    sid = create_session(url, idle_timeout_seconds=0.5).body["session_id"]

    def ended() -> bool:
        return get(url, f"/v1/sessions/{sid}").body["state"] == "ENDED"

    wait_for(ended, "the session's idle end", WAIT_SECONDS)
    record = get(url, f"/v1/sessions/{sid}").body
    assert record["end_reason"] == "idle_timeout"
    answer = _call(url, sid, "pid")
    assert answer.status == 410 and answer.body["error"]["kind"] == "session_ended"
    assert "--session-idle-seconds" in answer.body["error"]["message"]
    assert get(url, "/v1/info").body["sessions"]["active"] == 0
    assert create_session(url).status == 201  # its seat is free again


def test_an_idle_timeout_a_session_asked_for_is_named_as_its_own_not_as_the_server_flag(
    server_factory,
) -> None:
    url = server_factory("--max-sessions", "2", "--session-idle-seconds", "1").url
    asked = create_session(url, idle_timeout_seconds=0.5).body["session_id"]
    default = create_session(url).body["session_id"]

    def ended(sid: str) -> bool:
        return get(url, f"/v1/sessions/{sid}").body["state"] == "ENDED"

    wait_for(lambda: ended(asked) and ended(default), "both sessions' idle end", WAIT_SECONDS)
    # it said "(--session-idle-seconds)" for both: the one that asked for 0.5 s read that
    # the server's flag (1 s here) had ended it
    assert get(url, f"/v1/sessions/{asked}").body["end_message"] == (
        "session ended after 0.5 s without a program (the session's idle_timeout_seconds; "
        "--session-idle-seconds allows 1 s)"
    )
    assert (
        _call(url, asked, "pid")
        .body["error"]["message"]
        .startswith(
            "session ended after 0.5 s without a program (the session's idle_timeout_seconds;"
        )
    )
    assert get(url, f"/v1/sessions/{default}").body["end_message"] == (
        "session ended after 1 s without a program (--session-idle-seconds)"
    )


def test_a_killed_session_worker_ends_the_session_and_the_next_program_says_why(
    kcoral_server,
) -> None:
    url = kcoral_server.url
    sid = create_session(url).body["session_id"]
    pid = value_of(_call(url, sid, "pid"), "pid")
    os.kill(int(pid), signal.SIGKILL)  # type: ignore[call-overload]
    wait_for(
        lambda: get(url, f"/v1/sessions/{sid}").body["state"] == "ENDED",
        "the session's end",
        WAIT_SECONDS,
    )
    answer = _call(url, sid, "pid")
    assert answer.status == 410, answer.body
    message = answer.body["error"]["message"]
    assert "worker exited" in message and "state is lost" in message
    assert get(url, f"/v1/sessions/{sid}").body["end_reason"] == "worker_exited"


def test_ending_a_session_is_idempotent_and_frees_its_seat(kcoral_server) -> None:
    url = kcoral_server.url
    sid = create_session(url).body["session_id"]
    # A live session's seat is in the node's status and its record says its worker's memory.
    pid = value_of(_call(url, sid, "pid"), "pid")
    record = get(url, f"/v1/sessions/{sid}").body
    assert isinstance(record["memory_bytes"], int) and record["memory_bytes"] > 0
    seats = get(url, "/internal/worker-status").body["session_seats"]
    assert [(s["session_id"], s["worker_pid"], s["owner"]) for s in seats] == [
        (sid, pid, "default")
    ]
    assert seats[0]["seat_id"] == record["worker_id"] and seats[0]["gpu_ids"] == []
    assert seats[0]["state"] == "IDLE" and seats[0]["memory_bytes"] > 0
    for _ in range(2):
        ended = request(url, "DELETE", f"/v1/sessions/{sid}")
        assert ended.status == 200 and ended.body["end_reason"] == "deleted"
    assert _call(url, sid, "pid").status == 410
    assert get(url, f"/v1/sessions/{sid}").body["memory_bytes"] is None
    assert get(url, "/internal/worker-status").body["session_seats"] == []
    assert create_session(url).status == 201


def test_bad_session_bodies_and_unknown_ids_are_refused(kcoral_server) -> None:
    url = kcoral_server.url
    assert create_session(url, gpu_count=1).status == 400  # a CPU server
    assert create_session(url, idle_timeout_seconds=10_000).status == 400
    assert create_session(url, colour="blue").status == 400
    unknown = "00000000-0000-4000-8000-000000000000"
    assert get(url, f"/v1/sessions/{unknown}").status == 404
    created = create_session(url)
    asking_a_gpu = module_program(STATE, [("pid", [])], gpu_count=1)
    refused = run_in(url, created.body["session_id"], asking_a_gpu)
    assert refused.status == 400
    assert "differs from this session's (none: a CPU session)" in refused.body["error"]["message"]
    assert _call(url, unknown, "pid").status == 404


def test_a_session_body_nested_deeper_than_the_stack_is_refused_as_parse(kcoral_server) -> None:
    """Any caller of ``POST /v1/sessions`` chooses its body: nesting deeper than the
    interpreter's stack once answered 500 ``engine`` (a ``RecursionError``)."""
    url = kcoral_server.url
    for body in (
        b"[" * 30_000 + b"]" * 30_000,
        b'{"gpu_count":' + b"[" * 5000 + b"]" * 5000 + b"}",
    ):
        answer = request(url, "POST", "/v1/sessions", body, {"Content-Type": "application/json"})
        assert answer.status == 400, answer.raw[:300]
        assert answer.body["error"]["kind"] == "parse"
    assert create_session(url).status == 201  # and the server goes on serving


@pytest.fixture
def named_server(server_factory, tmp_path: Path):
    tokens = tmp_path / "tokens"
    tokens.write_text("alice token-alice-0123456789\nbob token-bob-0123456789\n")
    tokens.chmod(0o600)
    return server_factory("--auth-token-file", str(tokens))


ALICE = {"Authorization": "Bearer token-alice-0123456789"}
BOB = {"Authorization": "Bearer token-bob-0123456789"}


def test_another_identitys_session_answers_exactly_as_an_unknown_one(named_server) -> None:
    url = named_server.url
    created = create_session(url, ALICE)
    assert created.body["owner"] == "alice"
    sid = created.body["session_id"]
    unknown = "00000000-0000-4000-8000-000000000000"
    program = module_program(STATE, [("pid", [])])
    # An id that is no UUID is unknown alike (it answered Tornado's bare "not found").
    for session_id in (sid, unknown, "x", "not-a-session"):
        assert get(url, f"/v1/sessions/{session_id}", BOB).body["error"] == {
            "kind": "not_found",
            "message": "unknown session id",
        }
        assert run_in(url, session_id, program, BOB).status == 404
        assert request(url, "DELETE", f"/v1/sessions/{session_id}", None, BOB).status == 404
    assert get(url, "/v1/sessions", BOB).body == []
    assert get(url, f"/v1/sessions/{sid}", ALICE).body["state"] == "IDLE"
    assert run_in(url, sid, program, ALICE).body["status"] == "COMPLETED"


LOOP = """
import json, os, time
import kcoral.session as session
def spin(marker, stubborn):
    session.namespace["kept"] = "yes"
    open(marker, "w").close()
    while True:
        try:
            time.sleep(0.05)
        except KeyboardInterrupt:
            if not stubborn:
                raise
"""


def _spin_in_background(url: str, sid: str, marker: Path, stubborn: bool) -> tuple:
    answers: list[Response] = []
    program = module_program(LOOP, [("spin", [str(marker), stubborn])])
    thread = threading.Thread(target=lambda: answers.append(run_in(url, sid, program)))
    thread.start()
    wait_for(marker.exists, "the program's start", WAIT_SECONDS)
    return thread, answers


def test_an_interrupt_raises_keyboardinterrupt_in_the_program_and_keeps_the_session(
    kcoral_server, tmp_path: Path
) -> None:
    url = kcoral_server.url
    sid = create_session(url).body["session_id"]
    thread, answers = _spin_in_background(url, sid, tmp_path / "started", stubborn=False)
    interrupted = request(url, "POST", f"/v1/sessions/{sid}/interrupt")
    assert interrupted.status == 200 and interrupted.body["state"] == "RUNNING"
    thread.join()
    body = answers[0].body
    assert body["status"] == "FAILED" and "KeyboardInterrupt" in json.dumps(body["error"])
    wait_for(
        lambda: get(url, f"/v1/sessions/{sid}").body["state"] == "IDLE",
        "the session idle again",
        WAIT_SECONDS,
    )
    take = module_program(STATE, [("take", ["kept"])])
    assert value_of(run_in(url, sid, take), "take") == ["yes", None]


WINDING_DOWN = """
import time
def spin(marker):
    open(marker, "w").close()
    try:
        while True:
            time.sleep(0.05)
    except KeyboardInterrupt:
        time.sleep(1)  # still stopping when the next program arrives
        raise
"""


def test_a_program_sent_while_an_interrupted_one_stops_waits_for_it_instead_of_409(
    kcoral_server, tmp_path: Path
) -> None:
    """A script that catches Ctrl-C and sends its next program at once used to get 409
    ``session_busy`` until the interrupted program had stopped (docs soak)."""
    url = kcoral_server.url
    sid = create_session(url).body["session_id"]
    assert value_of(_call(url, sid, "put", "kept", "yes"), "put") == ["kept"]
    marker = tmp_path / "started"
    program = module_program(WINDING_DOWN, [("spin", [str(marker)])])
    with ThreadPoolExecutor(1) as background:
        first = background.submit(run_in, url, sid, program)
        wait_for(marker.exists, "the program's start", WAIT_SECONDS)
        assert request(url, "POST", f"/v1/sessions/{sid}/interrupt").status == 200
        assert value_of(_call(url, sid, "take", "kept"), "take") == ["yes", None]
        assert first.result().body["status"] == "FAILED"
    # one program at a time still: a program sent while one runs is refused
    marker = tmp_path / "again"
    program = module_program(WINDING_DOWN, [("spin", [str(marker)])])
    with ThreadPoolExecutor(1) as background:
        running = background.submit(run_in, url, sid, program)
        wait_for(marker.exists, "the program's start", WAIT_SECONDS)
        assert _call(url, sid, "pid").status == 409
        request(url, "POST", f"/v1/sessions/{sid}/interrupt")
        assert running.result().body["status"] == "FAILED"


def test_a_program_sent_after_its_client_left_the_last_one_runs_once_that_one_stops(
    kcoral_server, tmp_path: Path
) -> None:
    """Ctrl-C in a script closes the connection; the program it left is interrupted, and
    the script's next program waits for it rather than being refused."""
    url = kcoral_server.url
    sid = create_session(url).body["session_id"]
    marker = tmp_path / "started"
    content_type, body = execute_body(module_program(WINDING_DOWN, [("spin", [str(marker)])]))
    left = connection(url, 60.0)
    left.request("POST", f"/v1/sessions/{sid}/execute", body, {"Content-Type": content_type})
    wait_for(marker.exists, "the program's start", WAIT_SECONDS)
    left.close()  # what Ctrl-C does to the client's connection
    answer = _call(url, sid, "pid")
    assert answer.status == 200 and answer.body["status"] == "COMPLETED", answer.body
    assert get(url, f"/v1/sessions/{sid}").body["programs"] == 2


def _worker_pid(server, session_id: str) -> int:
    """The session worker's pid as the server sees it (a sandbox's own pid namespace would
    give the program another number)."""
    started = [
        e
        for e in server.events()
        if e["event"] == "session_started" and e["session_id"] == session_id
    ]
    return started[-1]["pid"]


def test_an_interrupt_that_reaches_an_idle_sessions_worker_is_dropped_and_the_state_kept(
    kcoral_server,
) -> None:
    """The front-end signals while it counts a program as running, and that view lags the
    worker's: the signal can land after the program ended, while the worker waits for the
    next one. It used to raise there and end the worker with the session's state."""
    url = kcoral_server.url
    sid = create_session(url).body["session_id"]
    assert value_of(_call(url, sid, "put", "kept", "yes"), "put") == ["kept"]
    worker = _worker_pid(kcoral_server, sid)
    for _ in range(3):
        os.kill(worker, signal.SIGINT)  # what a late interrupt does
    assert value_of(_call(url, sid, "take", "kept"), "take") == ["yes", None]
    assert value_of(_call(url, sid, "pid"), "pid") == value_of(_call(url, sid, "pid"), "pid")
    record = get(url, f"/v1/sessions/{sid}").body
    assert record["state"] == "IDLE" and record["programs"] == 4


def test_an_interrupt_sent_as_soon_as_the_program_counts_as_running_stops_that_program(
    kcoral_server, tmp_path: Path
) -> None:
    """Sent before the worker took the program, the signal would land between programs and
    be dropped; the front-end holds it until the program's first instruction has begun. An
    interrupt that comes while the program still waits to start (the worker's clean-up
    after the last attempt) cancels it instead (EXTENSIONS §11): either way it never runs
    on uninterrupted, and the test tries again until five programs were interrupted so."""
    url = kcoral_server.url
    sid = create_session(url).body["session_id"]
    ran = 0
    for attempt in range(50):
        marker = tmp_path / f"started-{attempt}"
        program = module_program(LOOP, [("spin", [str(marker), False])])
        with ThreadPoolExecutor(1) as background:
            answer = background.submit(run_in, url, sid, program)
            while not answer.done() and (
                request(url, "POST", f"/v1/sessions/{sid}/interrupt").body["state"] != "RUNNING"
            ):
                pass  # interrupt at the first moment the session runs the program
            response = answer.result()
        if response.status == 409:  # interrupted before it started: it never ran
            assert response.body["error"]["kind"] == "cancelled", response.body
            assert not marker.exists()
            continue
        body = response.body
        assert body["status"] == "FAILED" and "KeyboardInterrupt" in json.dumps(body["error"])
        ran += 1
        wait_for(
            lambda: get(url, f"/v1/sessions/{sid}").body["state"] == "IDLE",
            "the session idle again",
            WAIT_SECONDS,
        )
        if ran == 5:
            break
    assert ran == 5
    assert value_of(_call(url, sid, "take", "kept"), "take") == ["yes", None]


def test_a_program_that_ignores_the_interrupt_is_killed_after_the_grace_and_ends_the_session(
    kcoral_server, tmp_path: Path
) -> None:
    url = kcoral_server.url
    sid = create_session(url).body["session_id"]
    thread, answers = _spin_in_background(url, sid, tmp_path / "started", stubborn=True)
    request(url, "POST", f"/v1/sessions/{sid}/interrupt")
    thread.join()
    # its client is told the session ended and why, not 499 'the job was cancelled'
    assert answers[0].status == 410 and answers[0].body["status"] == "ERROR"
    assert answers[0].body["error"]["kind"] == "session_ended"
    assert "did not stop within" in answers[0].body["error"]["message"]
    record = get(url, f"/v1/sessions/{sid}").body
    assert record["state"] == "ENDED" and record["end_reason"] == "interrupt_grace"
    answer = _call(url, sid, "pid")
    assert answer.status == 410 and "did not stop within" in answer.body["error"]["message"]


@pytest.mark.parametrize("kcoral_server", [FAKE_GPU], indirect=True)
def test_a_program_whose_session_is_deleted_under_it_is_answered_that_the_session_ended(
    kcoral_server, tmp_path: Path
) -> None:
    url = kcoral_server.url
    sid = create_session(url).body["session_id"]
    thread, answers = _spin_in_background(url, sid, tmp_path / "started", stubborn=True)
    assert request(url, "DELETE", f"/v1/sessions/{sid}").status == 200
    thread.join()
    # before: HTTP 499 (a status logged only, for requests nobody waits for) kind
    # 'cancelled', 'the job was cancelled', to a client that submitted no job
    answer = answers[0]
    assert answer.status == 410 and answer.body["status"] == "ERROR"
    ended = {"kind": "session_ended", "message": "session ended by its owner"}
    assert answer.body["error"] == ended
    # the GPU lease went with the killed worker
    program = module_program("def one():\n    return 1\n", [("one", [])])
    assert run_in(url, None, program).body["status"] == "COMPLETED"
    finished = [e for e in kcoral_server.events() if e["event"] == "request_finished"]
    assert [(e["finish_reason"], e["http_status"]) for e in finished][-2] == ("cancelled", 410)
    # a session's job so ended stays CANCELLED (its result: 409 cancelled), saying why
    sid = create_session(url).body["session_id"]
    marker = tmp_path / "job-started"
    content_type, body = execute_body(module_program(LOOP, [("spin", [str(marker), True])]))
    headers = {"Content-Type": content_type}
    job_id = request(url, "POST", f"/v1/sessions/{sid}/jobs", body, headers).body["job_id"]
    wait_for(marker.exists, "the program's start", WAIT_SECONDS)
    assert request(url, "DELETE", f"/v1/sessions/{sid}").status == 200
    wait_for(
        lambda: get(url, f"/v1/jobs/{job_id}").body["status"] != "RUNNING",
        "the job's end",
        WAIT_SECONDS,
    )
    job = get(url, f"/v1/jobs/{job_id}").body
    assert (job["status"], job["error_kind"]) == ("CANCELLED", "session_ended")
    # its result says why: it said only 'the job was cancelled', naming no cause (jobs soak)
    cancelled = {
        "kind": "cancelled",
        "message": "the job was cancelled: session ended by its owner",
    }
    assert get(url, f"/v1/jobs/{job_id}/result").body["error"] == cancelled


def test_a_worker_that_dies_during_a_program_ends_the_session(kcoral_server) -> None:
    url = kcoral_server.url
    sid = create_session(url).body["session_id"]
    die = module_program("import os\ndef die():\n    os._exit(3)\n", [("die", [])])
    assert run_in(url, sid, die).body["status"] == "FAILED"
    answer = _call(url, sid, "pid")
    assert answer.status == 410
    assert "exited during program" in answer.body["error"]["message"]


def test_a_session_ended_by_a_job_names_the_job_its_cell_showed(kcoral_server) -> None:
    # a notebook's session cell is a job: its cell says "job ID", and the end named the
    # program's request id, which the user never saw
    url = kcoral_server.url
    sid = create_session(url).body["session_id"]
    content_type, body = execute_body(
        module_program("import os\ndef die():\n    os._exit(3)\n", [("die", [])])
    )
    headers = {"Content-Type": content_type}
    job_id = request(url, "POST", f"/v1/sessions/{sid}/jobs", body, headers).body["job_id"]
    wait_for(
        lambda: get(url, f"/v1/jobs/{job_id}").body["status"] not in ("QUEUED", "RUNNING"),
        "the job's end",
        WAIT_SECONDS,
    )
    answer = _call(url, sid, "pid")
    assert answer.status == 410
    assert f"exited during job {job_id} (exit code 3)" in answer.body["error"]["message"]


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap (bwrap)")
@pytest.mark.parametrize("kcoral_server", [["--sandbox", "bubblewrap"]], indirect=True)
def test_state_persists_inside_the_bubblewrap_sandbox_too(kcoral_server) -> None:
    url = kcoral_server.url
    assert get(url, "/v1/info").body["sandbox"] == "bubblewrap"
    created = create_session(url)
    if created.status == 503 and "start" in created.body["error"]["message"]:
        pytest.skip(f"bubblewrap cannot start a worker here: {created.body['error']['message']}")
    sid = created.body["session_id"]
    value_of(_call(url, sid, "put", "k", 7), "put")
    assert value_of(_call(url, sid, "take", "k"), "take") == [7, None]
    assert request(url, "DELETE", f"/v1/sessions/{sid}").status == 200


def test_a_job_in_a_session_shares_its_state_and_is_read_through_v1_jobs(kcoral_server) -> None:
    url = kcoral_server.url
    sid = create_session(url).body["session_id"]
    value_of(_call(url, sid, "put", "model", "built"), "put")
    content_type, body = execute_body(module_program(STATE, [("take", ["model"])]))
    path = f"/v1/sessions/{sid}/jobs"
    submitted = request(url, "POST", path, body, {"Content-Type": content_type})
    assert submitted.status == 202, submitted.body
    job_id = submitted.body["job_id"]

    def finished() -> bool:
        return get(url, f"/v1/jobs/{job_id}").body["status"] not in ("QUEUED", "RUNNING")

    wait_for(finished, "the job's end", WAIT_SECONDS)
    assert value_of(get(url, f"/v1/jobs/{job_id}/result"), "take") == ["built", None]
    request(url, "DELETE", f"/v1/sessions/{sid}")
    ended = request(url, "POST", path, body, {"Content-Type": content_type})
    assert ended.status == 410 and ended.body["error"]["kind"] == "session_ended"


DIE_WITH_THE_NEXT_PROGRAM = """
import json, os, signal
import kcoral_server.worker.engine as engine
def arm():
    # the worker dies as the next program reaches it, before that program's first
    # instruction: a death between programs that nothing noticed before it was sent
    engine.Engine.run = lambda self, request, fds: os.kill(os.getpid(), signal.SIGKILL)
    return json.dumps(1)
"""


def test_a_program_that_finds_its_sessions_worker_dead_is_told_the_session_ended_not_500(
    kcoral_server,
) -> None:
    url = kcoral_server.url
    sid = create_session(url).body["session_id"]
    armed = run_in(url, sid, module_program(DIE_WITH_THE_NEXT_PROGRAM, [("arm", [])]))
    assert value_of(armed, "arm") == 1
    answer = _call(url, sid, "pid")
    message = "session ended: its worker exited (signal 9); its state is lost"
    assert (answer.status, answer.body["error"]) == (
        410,
        {"kind": "session_ended", "message": message},
    )
    record = get(url, f"/v1/sessions/{sid}").body
    assert (record["end_reason"], record["end_message"]) == ("worker_exited", message)


WAIT_FOR_GO = """
import os, time
import kcoral.session as session
def f(marker, go):
    session.namespace["seen"] = True
    open(marker, "w").close()
    while not os.path.exists(go):
        time.sleep(0.01)
    return "finished"
"""


def test_a_session_job_still_running_when_the_server_drains_finishes_before_the_session_ends(
    kcoral_server, tmp_path: Path
) -> None:
    marker, go = tmp_path / "marker", tmp_path / "go"
    program = kcoral.Program()
    waits = program.get_function(module=program.upload(kind="module", source=WAIT_FOR_GO), name="f")
    program.return_(key="done", value=program.run(fn=waits, args=[str(marker), str(go)]))
    with kcoral.Client(kcoral_server.url) as client:
        job = client.session().submit(program)
        wait_for(marker.exists, "the program's start", WAIT_SECONDS)
        kcoral_server.process.send_signal(signal.SIGTERM)
        wait_for(
            lambda: "shutdown_started" in {e["event"] for e in kcoral_server.events()},
            "the drain's start",
            WAIT_SECONDS,
        )
        go.touch()  # the drain has begun: the program ends only now
        result = job.result(timeout=60)
        assert (result.status, result["done"]) == ("COMPLETED", "finished")
    assert kcoral_server.process.wait(60) == 0
    ended = [e for e in kcoral_server.events() if e["event"] == "session_ended"]
    assert [(e["reason"], e["programs"]) for e in ended] == [("shutdown", 1)]
