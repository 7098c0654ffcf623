"""Fair session seats (EXTENSIONS §11) against real servers: one identity cannot take every
seat, the refusal says how many seats exist, how many the caller holds and when the
earliest frees by idle timeout; a server with one identity lets it take them all."""

from __future__ import annotations

import datetime
import re
import socket
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from http_helpers import execute_body, get, module_program, request
from kcoral_server.sessions.seat_shares import SeatRules, per_identity_cap
from kcoral_server.settings.config import InvalidConfigError, ServerConfig
from session_requests import create_session, run_in, value_of
from waiting import wait_for

import kcoral

ALICE = {"Authorization": "Bearer token-alice-0123456789"}
BOB = {"Authorization": "Bearer token-bob-0123456789"}
ROOT = {"Authorization": "Bearer token-root-0123456789"}
WHEN = re.compile(r"in (\d+) s \(at (\S+)\)$")


def _token_file(tmp_path: Path, text: str) -> str:
    tokens = tmp_path / "tokens"
    tokens.write_text(text)
    tokens.chmod(0o600)
    return str(tokens)


def _team_server(server_factory, tmp_path: Path) -> str:
    """A server with two session seats for alice, bob and root (an admin); its URL."""
    tokens = _token_file(
        tmp_path,
        "alice token-alice-0123456789\nbob token-bob-0123456789\n"
        "root token-root-0123456789 admin\n",
    )
    return server_factory("--auth-token-file", tokens, "--max-sessions", "2").url


def _utc(seconds: float) -> str:
    moment = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _refusal(answer) -> str:
    assert answer.status == 503, answer.body
    assert answer.body["error"]["kind"] == "busy"
    return answer.body["error"]["message"]


def test_an_identity_at_its_cap_is_refused_with_the_counts_and_another_identity_gets_a_seat(
    server_factory, tmp_path: Path
) -> None:
    tokens = _token_file(tmp_path, "alice token-alice-0123456789\nbob token-bob-0123456789\n")
    url = server_factory("--auth-token-file", tokens, "--max-sessions", "3").url
    # alice takes seats up to the default cap, half of three rounded up
    first = create_session(url, ALICE, idle_timeout_seconds=300)
    second = create_session(url, ALICE, idle_timeout_seconds=500)
    assert first.status == 201 and second.status == 201, (first.body, second.body)
    message = _refusal(create_session(url, ALICE))
    assert message.startswith(
        "no session seat free (--max-sessions 3): 3 seats, 2 held, 2 by you, the most one "
        "identity may hold (--max-sessions-per-identity 2); the earliest of yours frees by "
        "idle timeout in "
    ), message
    seconds, at = WHEN.search(message).groups()
    assert 0 < int(seconds) <= 300
    assert at == _utc(first.body["idle_deadline"])  # the sooner of alice's two
    # what a router reads to place sessions (ROUTER §13): the cap and the caller's share
    info = get(url, "/v1/info", ALICE).body["sessions"]
    assert info["max_per_identity"] == 2 and info["held_by_you"] == 2
    assert get(url, "/v1/info", BOB).body["sessions"]["held_by_you"] == 0

    # bob still gets the seat alice cannot take; then every seat is held
    assert create_session(url, BOB).status == 201
    message = _refusal(create_session(url, BOB))
    assert message.startswith(
        "no session seat free (--max-sessions 3): 3 seats, 3 held, 1 by you; the earliest "
        "frees by idle timeout in "
    ), message
    assert WHEN.search(message).group(2) == _utc(first.body["idle_deadline"])


def test_a_session_an_admin_ends_tells_its_owner_an_admin_ended_it_not_that_they_did(
    server_factory, tmp_path: Path
) -> None:
    url = _team_server(server_factory, tmp_path)
    held = create_session(url, ALICE).body["session_id"]
    # the admin frees alice's seat for someone else (the panel's Stop button does the same)
    ended = request(url, "DELETE", f"/v1/sessions/{held}", headers=ROOT)
    assert ended.status == 200 and ended.body["end_reason"] == "deleted"
    assert ended.body["end_message"] == "session ended by admin root"
    # what alice reads: her record and her next program
    assert get(url, f"/v1/sessions/{held}", ALICE).body["end_message"] == (
        "session ended by admin root"
    )
    refused = run_in(url, held, module_program("def f():\n    return 1\n", [("f", [])]), ALICE)
    assert refused.status == 410
    assert refused.body["error"] == {
        "kind": "session_ended",
        "message": "session ended by admin root",
    }
    # a session its owner ends still says so
    own = create_session(url, ALICE).body["session_id"]
    mine = request(url, "DELETE", f"/v1/sessions/{own}", headers=ALICE)
    assert mine.body["end_message"] == "session ended by its owner"


KEEP = """
import json, kcoral.session
def keep(value):
    kcoral.session.namespace["kept"] = value
def kept():
    return json.dumps(kcoral.session.namespace.get("kept"))
"""


def test_an_admins_program_in_another_identitys_session_is_refused_and_the_session_lives_on(
    server_factory, tmp_path: Path
) -> None:
    url = _team_server(server_factory, tmp_path)
    held = create_session(url, ALICE).body["session_id"]
    kept = run_in(url, held, module_program(KEEP, [("keep", [[1, 2]])]), ALICE)
    assert kept.status == 200 and kept.body["status"] == "COMPLETED", kept.body
    # The session's worker serves alice alone: root's program used to replace it first
    # (alice's state lost) and then end the session ("its worker exited ... (exit code 0)").
    refused = run_in(url, held, module_program(KEEP, [("kept", [])]), ROOT)
    assert refused.status == 403, refused.body
    assert refused.body["error"] == {
        "kind": "forbidden",
        "message": "this session runs only its owner's programs (alice); "
        "an admin may read, interrupt and end it",
    }
    content_type, body = execute_body(module_program(KEEP, [("kept", [])]))
    as_job = request(
        url, "POST", f"/v1/sessions/{held}/jobs", body, {"Content-Type": content_type, **ROOT}
    )
    assert as_job.status == 403, as_job.body
    # alice's session and its state are untouched; the admin still reads it
    assert get(url, f"/v1/sessions/{held}", ROOT).body["state"] == "IDLE"
    answer = run_in(url, held, module_program(KEEP, [("kept", [])]), ALICE)
    assert value_of(answer, "kept") == [1, 2]


HOLD_THE_GPU = """
import os, time
while not os.path.exists(GO):
    time.sleep(0.01)
def done():
    return 1
"""


def test_a_session_whose_client_left_while_it_started_ends_and_frees_its_seat(
    server_factory, tmp_path: Path
) -> None:
    url = server_factory(
        "--device", "fake-gpu", "--fake-gpu-count", "1", "--workers-per-gpu", "1"
    ).url
    go = tmp_path / "go"
    # a module whose top-level code runs under the GPU's lease until `go` appears: a
    # session's worker starts CUDA under that lease (SERVER §5), so its create waits
    holder = kcoral.Client(url)
    program = kcoral.Program()
    module = program.upload(kind="module", source=f"GO = {str(go)!r}" + HOLD_THE_GPU)
    program.run(fn=program.get_function(module=module, name="done"), args=[])
    job = holder.submit(program)
    for event in job.events():
        if event.kind == "phase" and event.data.get("phase") == "lease_held":
            break
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    creating = socket.create_connection((host, int(port)))
    head = f"POST /v1/sessions HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: 0\r\n\r\n"
    creating.sendall(head.encode())
    wait_for(
        lambda: get(url, "/v1/info").body["sessions"]["active"] == 1,
        "the creator's session active",
        60.0,
    )
    creating.close()  # the creator gives up (Ctrl-C) while its session waits to start
    go.touch()
    assert job.result(timeout=60).status == "COMPLETED"

    def started() -> dict:
        return request(url, "GET", "/v1/sessions").body[0]

    wait_for(lambda: started()["state"] != "STARTING", "the session past STARTING", 60.0)
    # it became IDLE and held its seat (and its owner's share) for the idle timeout
    assert started()["state"] == "ENDED", started()
    assert started()["end_message"] == "session ended: its client left before it had started"
    assert get(url, "/v1/info").body["sessions"]["active"] == 0
    holder.close()


@pytest.mark.parametrize(
    "token_text", [None, "alice token-alice-0123456789\n"], ids=["no token", "one identity"]
)
def test_a_server_with_one_identity_lets_it_take_every_seat(
    server_factory, tmp_path: Path, token_text: str | None
) -> None:
    args = ["--max-sessions", "2"]
    if token_text is not None:
        args += ["--auth-token-file", _token_file(tmp_path, token_text)]
    url = server_factory(*args).url
    assert [create_session(url, ALICE).status for _ in range(2)] == [201, 201]
    message = _refusal(create_session(url, ALICE))
    assert message.startswith("no session seat free (--max-sessions 2): 2 seats, 2 held, 2 by you;")
    assert "--max-sessions-per-identity" not in message
    assert get(url, "/v1/info", ALICE).body["sessions"]["max_per_identity"] is None


def test_a_cap_of_zero_lets_one_of_several_identities_take_every_seat(
    server_factory, tmp_path: Path
) -> None:
    tokens = _token_file(tmp_path, "alice token-alice-0123456789\nbob token-bob-0123456789\n")
    url = server_factory(
        "--auth-token-file", tokens, "--max-sessions", "2", "--max-sessions-per-identity", "0"
    ).url
    assert [create_session(url, ALICE).status for _ in range(2)] == [201, 201]
    assert _refusal(create_session(url, BOB)).startswith("no session seat free")


def test_an_identity_that_asks_for_seats_all_at_once_still_gets_only_its_cap(
    server_factory, tmp_path: Path
) -> None:
    tokens = _token_file(tmp_path, "alice token-alice-0123456789\nbob token-bob-0123456789\n")
    url = server_factory("--auth-token-file", tokens, "--max-sessions", "4").url
    # the seat counts from the moment a create is admitted, before its worker has started
    with ThreadPoolExecutor(4) as pool:
        statuses = sorted(pool.map(lambda _: create_session(url, ALICE).status, range(4)))
    assert statuses == [201, 201, 503, 503]
    assert create_session(url, BOB).status == 201


@pytest.mark.parametrize(
    ("seats", "setting", "identities", "cap"),
    [
        (3, None, 2, 2),
        (4, None, 5, 2),
        (2, None, 2, 1),
        (1, None, 2, None),  # one seat: nothing to share
        (3, None, 1, None),  # one identity (or a token-less server): nobody to be fair to
        (3, None, None, 2),  # a node behind a router: the router's identities count as several
        (3, 0, 2, None),
        (3, 1, 1, 1),
    ],
)
def test_the_default_cap_is_half_the_seats_only_with_two_seats_and_two_identities(
    seats: int, setting: int | None, identities: int | None, cap: int | None
) -> None:
    assert per_identity_cap(seats, setting, identities) == cap


class _Held:
    def __init__(self, owner: str, deadline: float | None) -> None:
        self.owner = owner
        self.deadline = deadline

    def idle_deadline(self) -> float | None:
        return self.deadline


def test_a_refusal_while_every_session_runs_says_none_frees_by_idle_timeout_yet() -> None:
    rules = SeatRules(seats=2, cap=1)
    assert rules.refusal([_Held("bob", None)], "alice", now=0.0) is None
    message = rules.refusal([_Held("alice", None), _Held("bob", 50.0)], "alice", now=0.0)
    assert message == (
        "no session seat free (--max-sessions 2): 2 seats, 2 held, 1 by you, the most one "
        "identity may hold (--max-sessions-per-identity 1); none of yours is idle, so none "
        "frees by idle timeout before its program ends"
    )


def test_a_refusal_counts_one_seat_as_one_seat() -> None:
    message = SeatRules(seats=1, cap=None).refusal([_Held("bob", None)], "alice", now=0.0)
    assert message is not None
    assert message.startswith("no session seat free (--max-sessions 1): 1 seat, 1 held, 0 by")


def test_a_negative_per_identity_cap_is_refused() -> None:
    with pytest.raises(InvalidConfigError, match="max_sessions_per_identity"):
        ServerConfig(max_sessions_per_identity=-1)
