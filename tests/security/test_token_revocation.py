"""Revoking a client token without a restart (EXTENSIONS §6, README "Security"), against
real servers.

The attacker is the holder of a revoked token (alice's, leaked): before, revoking it meant
a restart that ended everyone's work, and a ``SIGHUP`` (the Unix way to re-read a
configuration) killed the server outright. Now the operator edits the token file and sends
``SIGHUP``: alice's token is refused from her very next request, on a connection she already
holds too, her open event stream ends, her running job, her waiting ``/execute`` and her
session end saying the token was revoked, and everyone else works on. A bad new file keeps
the old tokens, and says why.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import threading
from pathlib import Path

from identity_support import (
    BOUNDARY,
    TOKEN_A,
    TOKEN_B,
    TOKEN_R,
    Answer,
    module_program,
    request,
    token_file,
)
from identity_support import execute as run
from waiting import wait_for

import kcoral

WAIT_FOR_GO = """
import os, time
def f(go):
    print("started", flush=True)
    while not os.path.exists(go):
        time.sleep(0.02)
    return "done"
"""

TOUCH_AND_WAIT = """
import os, time
def f(running, go):
    open(running, "w").close()
    while not os.path.exists(go):
        time.sleep(0.02)
    return "done"
"""

WITHOUT_ALICE = f"bob {TOKEN_B}\nroot {TOKEN_R} admin\n"


def _plain_program(source: str, *args: object) -> dict:
    """A program as raw JSON, as an attacker's raw ``/execute`` sends it."""
    return {
        "instructions": [
            {"op": "upload", "kind": "module", "id": "m", "source": source},
            {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": "f"},
            {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": list(args)},
            {"op": "return", "key": "r", "value": {"$ref": "r"}},
        ]
    }


def _named(server, event: str) -> list[dict]:
    return [record for record in server.events() if record.get("event") == event]


def _hang_up(server, event: str) -> dict:
    """Send SIGHUP and wait for the reload's own line, ``event``; that line."""
    seen = len(_named(server, event))
    server.process.send_signal(signal.SIGHUP)
    wait_for(lambda: len(_named(server, event)) > seen, event, 60.0)
    assert server.process.poll() is None
    return _named(server, event)[-1]


def _rewrite(path: Path, text: str) -> None:
    """As an operator replaces a secret: a new file moved over the old one."""
    new = path.with_name("tokens.new")
    new.write_text(text, encoding="utf-8")
    os.chmod(new, 0o600)
    os.replace(new, path)


def _on(connection: http.client.HTTPConnection, path: str, token: str) -> Answer:
    """A request on a connection the caller already holds (keep-alive)."""
    connection.request("GET", path, headers={"Authorization": f"Bearer {token}"})
    response = connection.getresponse()
    return Answer(response.status, dict(response.getheaders()), response.read())


def test_a_revoked_token_is_refused_at_once_and_its_programs_and_sessions_end(
    server_factory, tmp_path: Path
) -> None:
    tokens = token_file(tmp_path / "secrets")
    server = server_factory(
        "--auth-token-file", str(tokens), "--num-workers", "2", "--max-sessions", "1"
    )
    never = str(tmp_path / "never")
    with kcoral.Client(server.url, token=TOKEN_A) as alice:
        job = alice.submit(module_program(WAIT_FOR_GO, never))
        host, port = server.url.split("://", 1)[1].rsplit(":", 1)
        held = http.client.HTTPConnection(host, int(port), timeout=60)
        assert _on(held, "/v1/info", TOKEN_A).status == 200
        stream = http.client.HTTPConnection(host, int(port), timeout=60)
        stream.request(
            "GET", f"/v1/jobs/{job.id}/events", headers={"Authorization": f"Bearer {TOKEN_A}"}
        )
        events = stream.getresponse()
        assert events.status == 200
        while b"started" not in events.readline():  # her program runs
            pass
        session = request(server.url, "POST", "/v1/sessions", TOKEN_A, b"{}")
        assert session.status == 201, session.raw
        session_id = session.json["session_id"]
        waiting: list[Answer] = []
        running = tmp_path / "running"
        program = _plain_program(TOUCH_AND_WAIT, str(running), never)
        execute = threading.Thread(target=lambda: waiting.append(run(server.url, program, TOKEN_A)))
        execute.start()
        wait_for(running.exists, "alice's /execute running", 60.0)

        _rewrite(tokens, WITHOUT_ALICE)
        reloaded = _hang_up(server, "tokens_reloaded")

        assert reloaded["revoked"] == ["alice"] and reloaded["identities"] == 2
        assert TOKEN_A not in json.dumps(reloaded)
        # Her next request is refused, on the connection she already held too.
        refused = _on(held, "/v1/info", TOKEN_A)
        assert refused.status == 401 and refused.json["error"]["kind"] == "unauthorized"
        assert request(server.url, "GET", f"/v1/jobs/{job.id}", TOKEN_A).status == 401
        # Her open event stream ends.
        events.read()
        # Her waiting /execute is answered, and says why.
        execute.join(60)
        assert waiting and waiting[0].status == 401
        assert "token of identity alice was revoked" in waiting[0].json["error"]["message"]
        held.close()
        stream.close()

    # Her running job ended cancelled, and says why, to whoever may still read it.
    done = request(server.url, "GET", f"/v1/jobs/{job.id}/events", TOKEN_R)
    assert b'"status":"CANCELLED"' in done.raw
    told = request(server.url, "GET", f"/v1/jobs/{job.id}/result", TOKEN_R)
    assert told.status == 409 and told.json["error"]["message"] == (
        "the job was cancelled: the token of identity alice was revoked"
    )
    ended = request(server.url, "GET", f"/v1/sessions/{session_id}", TOKEN_R).json
    assert ended["state"] == "ENDED" and ended["end_reason"] == "token_revoked"
    assert ended["end_message"] == "session ended: the token of identity alice was revoked"
    # Everyone else works on: bob runs a program (on the seat alice's session freed).
    with kcoral.Client(server.url, token=TOKEN_B) as bob:
        assert bob.execute(module_program("def f():\n    return 7\n")).results["r"] == 7
        assert request(server.url, "POST", "/v1/sessions", TOKEN_B, b"{}").status == 201


def test_a_bad_token_file_keeps_the_old_tokens_and_says_why(server_factory, tmp_path: Path) -> None:
    tokens = token_file(tmp_path / "secrets")
    server = server_factory("--auth-token-file", str(tokens), "--num-workers", "2")
    bad = {
        "": "is empty",
        f"alice {TOKEN_A}\nbob\n": "line 2: expected 'NAME TOKEN' or 'NAME TOKEN admin'",
        f"alice {TOKEN_A}\nalice {TOKEN_B}\n": "line 2: identity 'alice' is listed twice",
        f"alice {TOKEN_A}\nbob {TOKEN_A}\n": "line 2: the token of 'bob' is already used",
        f"alice {TOKEN_A}\nbob {TOKEN_B} root\n": "line 2: expected 'NAME TOKEN'",
    }
    for text, problem in bad.items():
        _rewrite(tokens, text)
        failed = _hang_up(server, "token_reload_failed")
        assert failed["level"] == "ERROR" and failed["path"] == str(tokens)
        assert failed["message"].startswith(f"the token file {problem}")
        assert failed["message"].endswith("; the old tokens stay")
        # Nothing half-applied: every old token opens what it did, bob is still no admin.
        for token, name in ((TOKEN_A, "alice"), (TOKEN_B, "bob"), (TOKEN_R, "root")):
            assert request(server.url, "GET", "/v1/info", token).json["identity"] == name
    tokens.unlink()  # moved away: unreadable
    failed = _hang_up(server, "token_reload_failed")
    assert "cannot be read: No such file or directory" in failed["message"]
    assert request(server.url, "GET", "/v1/info", TOKEN_A).status == 200
    assert not _named(server, "tokens_reloaded")
    # Ending an identity's work is no client's to ask: a plain server has no such path.
    assert request(server.url, "POST", "/v1/revocations/alice", TOKEN_R).status == 404


def test_a_changed_token_keeps_its_identity_s_work_and_admin_changes_count_at_once(
    server_factory, tmp_path: Path
) -> None:
    tokens = token_file(tmp_path / "secrets")
    server = server_factory("--auth-token-file", str(tokens), "--num-workers", "2")
    go = tmp_path / "go"
    with kcoral.Client(server.url, token=TOKEN_A) as alice:
        job = alice.submit(module_program(WAIT_FOR_GO, str(go)))
    assert request(server.url, "GET", f"/v1/jobs/{job.id}", TOKEN_B).status == 404
    fresh = "alice-new-token-0123456789"
    _rewrite(tokens, f"alice {fresh}\nbob {TOKEN_B} admin\nroot {TOKEN_R}\n")
    reloaded = _hang_up(server, "tokens_reloaded")
    assert reloaded["revoked"] == [] and reloaded["admin_changed"] == ["bob", "root"]
    assert request(server.url, "GET", "/v1/info", TOKEN_A).status == 401
    # bob is an admin now, root no longer: from their next request.
    assert request(server.url, "GET", f"/v1/jobs/{job.id}", TOKEN_B).status == 200
    assert request(server.url, "GET", f"/v1/jobs/{job.id}", TOKEN_R).status == 404
    # alice's job ran on; her new token reaches it and its result.
    go.touch()
    with kcoral.Client(server.url, token=fresh) as alice:
        assert alice.job(job.id).result().results["r"] == "done"


def test_sighup_without_a_token_file_changes_nothing(server_factory) -> None:
    shared = "shared-token-0123456789"
    server = server_factory(env={"KCORAL_AUTH_TOKEN": shared})
    skipped = _hang_up(server, "token_reload_skipped")
    assert "no --auth-token-file to reload" in skipped["message"]
    assert request(server.url, "GET", "/v1/info", shared).status == 200


TOUCH = """
def f(path):
    open(path, "w").close()
"""


def test_a_program_whose_upload_was_arriving_when_its_token_was_revoked_never_runs(
    server_factory, tmp_path: Path
) -> None:
    """alice's head was checked, her body still arriving, when her token was revoked: there
    was no request to cancel yet, and once the body had come the program ran for her."""
    tokens = token_file(tmp_path / "secrets")
    server = server_factory("--auth-token-file", str(tokens))
    ran = tmp_path / "ran"
    body = _multipart(_plain_program(TOUCH, str(ran)))
    with socket.create_connection((server.host, server.port), timeout=60) as upload:
        head = (
            f"POST /execute HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN_A}\r\n"
            f"Content-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
            f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n"
        )
        upload.sendall(head.encode())
        reader = upload.makefile("rb")
        assert reader.readline().startswith(b"HTTP/1.1 100")  # her head passed the checks
        assert reader.readline() == b"\r\n"
        upload.sendall(body[:10])

        _rewrite(tokens, WITHOUT_ALICE)
        _hang_up(server, "tokens_reloaded")
        upload.sendall(body[10:])
        status = reader.readline()
    assert status.startswith(b"HTTP/1.1 401"), status
    assert not ran.exists()


def _multipart(program: dict) -> bytes:
    """``/execute``'s body for ``program`` (no blobs)."""
    head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="program"\r\n'
    part = f"{head}Content-Type: application/json\r\n\r\n".encode() + json.dumps(program).encode()
    return part + f"\r\n--{BOUNDARY}--\r\n".encode()
