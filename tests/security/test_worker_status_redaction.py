"""``/internal/worker-status`` tells a stranger only counts (issue 28, point 4).

Attacker: any local process (another user of a shared GPU box, or another identity's
program). The endpoint answers loopback peers without a token, since published node
supervisors probe it without one; it used to list every session's id, owner and worker pid,
which with ``--sandbox none`` was the map one user needed to read another user's session
memory. Now a caller without a credential this server accepts sees the seats as a count.
"""

from __future__ import annotations

import json

import pytest
from raw_http import request
from server_process import start_server

ALICE = "alice-token-0123456789abcdef"
BOB = "bob-token-0123456789abcdef"
ADMIN = "root-token-0123456789abcdef"


@pytest.fixture(scope="module")
def server_with_a_session(tmp_path_factory: pytest.TempPathFactory):
    directory = tmp_path_factory.mktemp("worker-status")
    tokens = directory / "tokens"
    tokens.write_text(f"alice {ALICE}\nbob {BOB}\nroot {ADMIN} admin\n")
    tokens.chmod(0o600)
    server = start_server(
        directory / "server",
        ["--auth-token-file", str(tokens), "--num-workers", "1", "--max-sessions", "1"],
    )
    try:
        created = request(
            server.url,
            "POST",
            "/v1/sessions",
            b"{}",
            {"Authorization": f"Bearer {ALICE}"},
            timeout=120,
        )
        assert created.status == 201, created.body
        yield server, created.body["session_id"]
    finally:
        server.stop()


def test_a_local_process_without_a_token_sees_session_seats_as_a_count_only(
    server_with_a_session,
) -> None:
    server, session_id = server_with_a_session
    full = request(
        server.url, "GET", "/internal/worker-status", headers={"Authorization": f"Bearer {ALICE}"}
    )
    (seat,) = full.body["session_seats"]
    stranger = request(server.url, "GET", "/internal/worker-status")
    assert stranger.status == 200
    body = stranger.body
    assert set(body) == {
        "status",
        "instance_id",
        "target",
        "versions",
        "worker_count",
        "busy_workers",
        "cache_descriptors",
        "session_seat_count",
        "draining",  # a bool /health's request_capacity tells anyone already
    }
    assert body["session_seat_count"] == 1 and body["status"] == "ok"
    assert body["draining"] is False
    text = stranger.raw.decode()
    assert session_id not in text and "alice" not in text
    assert f"{seat['worker_pid']}" not in json.dumps(
        {k: v for k, v in body.items() if k != "instance_id"}
    )
    # A wrong token is no credential either.
    forged = request(
        server.url, "GET", "/internal/worker-status", headers={"Authorization": "Bearer guess"}
    )
    assert forged.status == 200 and "session_seats" not in forged.body


def test_a_token_holder_sees_the_seats_of_its_own_sessions(server_with_a_session) -> None:
    server, session_id = server_with_a_session
    for token in (ALICE, ADMIN):
        answer = request(
            server.url,
            "GET",
            "/internal/worker-status",
            headers={"Authorization": f"Bearer {token}"},
        )
        assert answer.status == 200
        (seat,) = answer.body["session_seats"]
        assert seat["session_id"] == session_id and seat["owner"] == "alice"
        assert isinstance(seat["worker_pid"], int)
        assert answer.body["session_seat_count"] == 1


def test_another_token_holder_sees_the_seat_as_a_count_only(server_with_a_session) -> None:
    """Attacker: bob, another token holder on the same server. Alice's session id, name and
    worker pid stay out of what he reads; that a seat is held is a count."""
    server, session_id = server_with_a_session
    full = request(
        server.url, "GET", "/internal/worker-status", headers={"Authorization": f"Bearer {ALICE}"}
    )
    (seat,) = full.body["session_seats"]
    answer = request(
        server.url, "GET", "/internal/worker-status", headers={"Authorization": f"Bearer {BOB}"}
    )
    assert answer.status == 200
    assert answer.body["session_seats"] == [] and answer.body["session_seat_count"] == 1
    text = answer.raw.decode()
    assert session_id not in text and "alice" not in text
    assert str(seat["worker_pid"]) not in json.dumps(
        {k: v for k, v in answer.body.items() if k != "instance_id"}
    )


def test_a_token_holder_cannot_make_the_server_say_it_drains(server_with_a_session) -> None:
    """Attacker: bob, a token holder, who would take a node out of its router's rotation by
    making its worker-status say ``draining`` (ROUTER §6). Only the server's own SIGTERM
    sets it: no method or body of his reaches it, and the server keeps taking work."""
    server, _ = server_with_a_session
    bob = {"Authorization": f"Bearer {BOB}", "Content-Type": "application/json"}
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        answer = request(server.url, method, "/internal/worker-status", b'{"draining": true}', bob)
        assert answer.status in (404, 405), (method, answer.status, answer.body)
    after = request(server.url, "GET", "/internal/worker-status", headers=bob)
    assert after.status == 200 and after.body["draining"] is False
    health = request(server.url, "GET", "/health")
    assert health.body["load"]["request_capacity"] > 0
