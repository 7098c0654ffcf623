"""Revoking a client token at a router (EXTENSIONS §6, token reload; ROUTER §3), with a real
router and a real node.

The attacker holds alice's revoked token. The router holds the client tokens, its nodes none:
before, a ``SIGHUP`` ended the router, and revoking meant restarting it (every client's
connections and queued requests lost) while alice's programs ran on at the nodes. Now the
router reloads its file on ``SIGHUP``: alice's token gets 401 from her next request, and each
node cancels her running job and ends her session, saying why. A bad file keeps the old
tokens.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from waiting import wait_for

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from identity_support import (
    BOUNDARY,
    TOKEN_A,
    TOKEN_B,
    TOKEN_R,
    execute,
    module_program,
    request,
    sha256,
    token_file,
)
from kcoral_server.node.handover import SECRETS_FD_ENV, NodeSecrets, write_secrets
from router_helpers import Node, RouterProcess, ready_nodes, start_router

import kcoral

pytestmark = pytest.mark.slow
NODE_ENV = {"KCORAL_NODE_TOKEN": "revocation-node-token-0123456789"}
WAIT = """
import os, time
def f(go):
    while not os.path.exists(go):
        time.sleep(0.02)
    return "done"
"""


def _hang_up(router: RouterProcess, event: str) -> str:
    """Send SIGHUP and wait for one more ``event`` line in the router's log; that line."""
    seen = router.log().count(f" {event} ")
    router.process.send_signal(signal.SIGHUP)
    wait_for(lambda: router.log().count(f" {event} ") > seen, event, 60.0)
    assert router.process.poll() is None
    return [line for line in router.log().splitlines() if f" {event} " in line][-1]


def _rewrite(path: Path, text: str) -> None:
    new = path.with_name("tokens.new")
    new.write_text(text, encoding="utf-8")
    os.chmod(new, 0o600)
    os.replace(new, path)


def test_a_router_revokes_a_token_on_sighup_and_its_nodes_end_that_identity_s_work(
    tmp_path: Path,
) -> None:
    tokens = token_file(tmp_path / "secrets")
    router = start_router(tmp_path, "--auth-token-file", str(tokens), env=NODE_ENV)
    node = Node(tmp_path, router, "node-revocation", NODE_ENV, "--num-workers", "2")
    try:
        ready_nodes(router, 1)
        url = router.url
        with kcoral.Client(url, token=TOKEN_A) as alice:
            job = alice.submit(module_program(WAIT, str(tmp_path / "never")))
            wait_for(lambda: job.status()["status"] == "RUNNING", "alice's job running", 60.0)
            session = request(url, "POST", "/v1/sessions", TOKEN_A, b"{}")
            assert session.status == 201, session.raw
            session_id = session.json["session_id"]

        # Only the router tells a node to end an identity's work: no client can, an
        # admin included (the router forwards nothing to that path).
        for token in (TOKEN_B, TOKEN_R):
            assert request(url, "POST", "/v1/revocations/alice", token).status == 404
        assert request(url, "GET", f"/v1/jobs/{job.id}", TOKEN_A).json["status"] == "RUNNING"

        # A file the router cannot use changes nothing.
        _rewrite(tokens, f"alice {TOKEN_A}\nbob {TOKEN_A}\n")
        failed = _hang_up(router, "token_reload_failed")
        assert "the token file line 2: the token of 'bob' is already used" in failed
        assert TOKEN_A not in failed
        assert request(url, "GET", "/v1/info", TOKEN_A).json["identity"] == "alice"

        _rewrite(tokens, f"bob {TOKEN_B}\nroot {TOKEN_R} admin\n")
        reloaded = _hang_up(router, "tokens_reloaded")
        assert 'revoked=["alice"]' in reloaded, reloaded
        refused = request(url, "GET", f"/v1/jobs/{job.id}", TOKEN_A)
        assert refused.status == 401 and refused.json["error"]["kind"] == "unauthorized"

        # Her job at the node ended cancelled, and says why; her session too.
        path = f"/v1/jobs/{job.id}"
        wait_for(
            lambda: request(url, "GET", path, TOKEN_R).json["status"] == "CANCELLED", "end", 60.0
        )
        told = request(url, "GET", f"{path}/result", TOKEN_R)
        assert told.status == 409 and told.json["error"]["message"] == (
            "the job was cancelled: the token of identity alice was revoked"
        )
        ended = request(url, "GET", f"/v1/sessions/{session_id}", TOKEN_R).json
        assert ended["end_reason"] == "token_revoked", ended
        assert "identity_revoked identity=alice nodes=1" in router.wait_log("identity_revoked")
        # bob works on, through the same router.
        with kcoral.Client(url, token=TOKEN_B) as bob:
            assert bob.execute(module_program("def f():\n    return 7\n")).results["r"] == 7
    finally:
        node.stop()
        router.stop()


@pytest.mark.parametrize("change", ["revoked", "rotated"])
def test_a_request_queued_at_the_router_never_runs_once_its_identity_is_revoked(
    tmp_path: Path, change: str
) -> None:
    """alice's request waits at the router for the node's one worker (bob's program holds
    it); her token is revoked meanwhile. Before the slot re-check it went on to the node,
    which had already ended alice's work and ran it for her anyway. A token rotated under
    the same name is no revocation: the request runs, as a server's waiting one does (the
    first re-check refused it, soak2)."""
    tokens = token_file(tmp_path / "secrets")
    router = start_router(tmp_path, "--auth-token-file", str(tokens), env=NODE_ENV)
    node = Node(tmp_path, router, "node-queue", NODE_ENV, "--num-workers", "1")
    go = tmp_path / "go"
    ran = tmp_path / "ran"
    answers: dict[str, int] = {}

    def send(who: str, token: str, program: dict) -> None:
        answers[who] = execute(router.url, program, token).status

    try:
        ready_nodes(router, 1)
        bob = threading.Thread(target=send, args=("bob", TOKEN_B, _raw(WAIT, str(go))))
        bob.start()
        wait_for(
            lambda: _health(router)["requests_in_progress"] == 1, "bob's program running", 60.0
        )
        alice = threading.Thread(target=send, args=("alice", TOKEN_A, _raw(TOUCH, str(ran))))
        alice.start()
        wait_for(lambda: _health(router)["requests_waiting"] == 1, "alice's request queued", 60.0)

        rotated = f"alice {TOKEN_A}-rotated\n" if change == "rotated" else ""
        _rewrite(tokens, f"{rotated}bob {TOKEN_B}\nroot {TOKEN_R} admin\n")
        _hang_up(router, "tokens_reloaded")
        if change == "revoked":
            router.wait_log("identity_revoked")
        go.touch()
        bob.join(60)
        alice.join(60)
        if change == "revoked":
            assert answers == {"bob": 200, "alice": 401}
            assert not ran.exists()  # her program never ran
        else:
            assert answers == {"bob": 200, "alice": 200} and ran.exists()
    finally:
        node.stop()
        router.stop()


TOUCH = """
def f(path):
    open(path, "w").close()
"""


def _raw(source: str, *args: object) -> dict:
    return {
        "instructions": [
            {"op": "upload", "kind": "module", "id": "m", "source": source},
            {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": "f"},
            {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": list(args)},
            {"op": "return", "key": "r", "value": {"$ref": "r"}},
        ]
    }


def _health(router: RouterProcess) -> dict:
    return request(router.url, "GET", "/health").json["load"]


def test_a_program_still_uploading_through_the_router_when_its_token_is_revoked_never_runs(
    tmp_path: Path,
) -> None:
    """alice's program part had reached the node, her blob still arriving, when her token
    was revoked: the node had no request of hers to cancel yet, and ran the program once
    the body had come."""
    tokens = token_file(tmp_path / "secrets")
    router = start_router(tmp_path, "--auth-token-file", str(tokens), env=NODE_ENV)
    node = Node(tmp_path, router, "node-upload", NODE_ENV)
    ran = tmp_path / "ran"
    blob = b"alice's weights " * 4096  # after the program part, still arriving
    program = _raw(TOUCH, str(ran))
    program["instructions"].insert(
        0, {"op": "upload", "kind": "bytes", "id": "w", "blob": sha256(blob)}
    )
    body = _multipart(program, blob)
    try:
        ready_nodes(router, 1)
        with socket.create_connection(("127.0.0.1", router.port), timeout=60) as upload:
            head = (
                f"POST /execute HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {TOKEN_A}"
                f"\r\nContent-Type: multipart/form-data; boundary={BOUNDARY}\r\n"
                f"Content-Length: {len(body)}\r\nExpect: 100-continue\r\n\r\n"
            )
            upload.sendall(head.encode())
            reader = upload.makefile("rb")
            assert reader.readline().startswith(b"HTTP/1.1 100")  # its head passed the checks
            assert reader.readline() == b"\r\n"
            upload.sendall(body[:-10])  # the router has read the program part: sent on
            wait_for(lambda: _health(router)["requests_in_progress"] == 1, "forwarded", 60.0)

            _rewrite(tokens, f"bob {TOKEN_B}\nroot {TOKEN_R} admin\n")
            _hang_up(router, "tokens_reloaded")
            assert "identity_revoked identity=alice nodes=1" in router.wait_log("nodes=1")
            upload.sendall(body[-10:])
            status = reader.readline()
        assert status.startswith(b"HTTP/1.1 401"), status
        assert not ran.exists()
    finally:
        node.stop()
        router.stop()


def _multipart(program: dict, blob: bytes) -> bytes:
    """``/execute``'s body: ``program``, then ``blob``."""
    parts = [("program", "application/json", json.dumps(program).encode())]
    parts.append((f"blob:{sha256(blob)}", "application/octet-stream", blob))
    body = b""
    for name, kind, data in parts:
        head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="{name}"\r\n'
        body += f"{head}Content-Type: {kind}\r\n\r\n".encode() + data + b"\r\n"
    return body + f"--{BOUNDARY}--\r\n".encode()


def test_sighup_to_a_node_changes_nothing_and_both_its_processes_name_the_router(
    tmp_path: Path,
) -> None:
    """A node holds no client tokens; an operator who sends every KCoral process SIGHUP
    after editing the router's file (or a closed terminal) ended the node and its child.
    Then the child said what a plain server without a token file says (no
    --auth-token-file), not that the router holds the tokens."""
    tokens = token_file(tmp_path / "secrets")
    router = start_router(tmp_path, "--auth-token-file", str(tokens), env=NODE_ENV)
    node = Node(tmp_path, router, "node-hangup", NODE_ENV)
    try:
        ready_nodes(router, 1)
        for count, pid in enumerate((node.process.pid, node.server_pid()), start=1):
            os.kill(pid, signal.SIGHUP)  # the supervisor, then its child server
            wait_for(lambda n=count: _skipped(node) == n, "token_reload_skipped", 60.0)
        assert node.process.poll() is None
        lines = node.log_path.read_text().splitlines()
        skipped = [line for line in lines if "token_reload_skipped" in line]
        assert all("send SIGHUP to its router to reload them" in line for line in skipped), skipped
        with kcoral.Client(router.url, token=TOKEN_B) as bob:
            assert bob.execute(module_program("def f():\n    return 7\n")).results["r"] == 7
    finally:
        node.stop()
        router.stop()


def _skipped(node: Node) -> int:
    return node.log_path.read_text().count("token_reload_skipped")


def test_a_node_whose_supervisor_is_frozen_when_a_token_is_revoked_is_told_through_its_server(
    tmp_path: Path,
) -> None:
    """alice's job runs on a node whose supervisor stream is down (frozen here) when the
    router revokes her token. Its server's control slots are open, so the node is told at
    once through them (``NodeRecord.reachable``; before 939c21b only at its supervisor's
    return, ``test_a_node_that_connects_after_a_revocation_is_told_then`` below), and bob's
    job, of an identity still served, runs on there."""
    tokens = token_file(tmp_path / "secrets")
    router = start_router(
        tmp_path,
        "--auth-token-file",
        str(tokens),
        "--status-check-interval-seconds",
        "0.3",
        "--max-status-age-seconds",
        "1",
        env=NODE_ENV,
    )
    node = Node(tmp_path, router, "node-away", NODE_ENV, "--num-workers", "2")
    frozen = False
    try:
        ready_nodes(router, 1)
        url = router.url
        with kcoral.Client(url, token=TOKEN_A) as alice:
            job = alice.submit(module_program(WAIT, str(tmp_path / "never")))
            wait_for(lambda: job.status()["status"] == "RUNNING", "alice's job running", 60.0)
        with kcoral.Client(url, token=TOKEN_B) as bob:
            bobs = bob.submit(module_program(WAIT, str(tmp_path / "go")))
        os.kill(node.process.pid, signal.SIGSTOP)  # its supervisor: no status reaches the router
        frozen = True
        wait_for(lambda: request(url, "GET", "/health").status == 503, "the node away", 60.0)

        _rewrite(tokens, f"bob {TOKEN_B}\nroot {TOKEN_R} admin\n")
        _hang_up(router, "tokens_reloaded")
        assert "identity_revoked identity=alice nodes=1" in router.wait_log("identity_revoked")
        path = f"/v1/jobs/{job.id}"
        wait_for(
            lambda: request(url, "GET", path, TOKEN_R).json.get("status") == "CANCELLED",
            "end",
            60.0,
        )
        told = request(url, "GET", f"{path}/result", TOKEN_R)
        assert told.status == 409 and told.json["error"]["message"] == (
            "the job was cancelled: the token of identity alice was revoked"
        )
        os.kill(node.process.pid, signal.SIGCONT)
        frozen = False
        # bob's job, of an identity still served, runs on there.
        assert request(url, "GET", f"/v1/jobs/{bobs.id}", TOKEN_B).json["status"] == "RUNNING"
        (tmp_path / "go").touch()
    finally:
        if frozen:
            os.kill(node.process.pid, signal.SIGCONT)
        node.stop()
        router.stop()


def test_a_node_that_connects_after_a_revocation_is_told_then(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A node not connected at all when a token was revoked (its tunnel down, or the router
    restarted with a changed file) is asked, once it connects, which identities have work
    there, and each one the router no longer serves is revoked there (``on_reconnect``).
    Before, nothing told it, and a leaked token's job ran on. An in-process router and a
    fake node that connects only after the reload."""
    import asyncio

    from kcoral_server.proto import kcoral_gateway_pb2 as pb
    from router_helpers import FakeNode, in_process_router

    tokens = token_file(tmp_path / "secrets")
    node_token = NODE_ENV["KCORAL_NODE_TOKEN"]
    monkeypatch.setenv("KCORAL_NODE_TOKEN", node_token)
    posted: list[tuple[str, str]] = []
    answer = [(b"content-type", b"application/json")]

    async def late_node(head: pb.RequestHead, body: bytes):
        pseudo = {h.name: h.value.decode() for h in head.headers}
        method, where = pseudo.get(b":method", "POST"), pseudo.get(b":path", "/execute")
        if where == "/v1/revocations":
            working = {"working": ["alice", "bob"], "revoked": []}
            return 200, answer, json.dumps(working).encode()
        if where.startswith("/v1/revocations/"):
            posted.append((method, where))
            return 200, answer, b"{}"
        return 404, answer, b"{}"

    async def scenario() -> str:
        async with in_process_router("--auth-token-file", str(tokens)) as router:
            _rewrite(tokens, f"bob {TOKEN_B}\nroot {TOKEN_R} admin\n")
            router.state.reload_tokens()  # what SIGHUP does; no node is connected
            node = FakeNode(
                router.grpc_port, "late", control_slots=2, handler=late_node, token=node_token
            )
            await node.start()
            try:
                for _ in range(400):  # a hang guard, not a timing check
                    if "on_reconnect=True" in router.lines.getvalue():
                        break
                    await asyncio.sleep(0.05)
            finally:
                await node.close()
            return router.lines.getvalue()

    log = asyncio.run(scenario())
    assert "identity_revoked identity=alice nodes=0" in log, log
    assert "identity_revoked identity=alice nodes=1" in log and "on_reconnect=True" in log, log
    assert posted == [("POST", "/v1/revocations/alice")]


def test_an_admin_demoted_by_a_reload_stops_watching_another_identity_s_job_through_the_router(
    tmp_path: Path,
) -> None:
    """root, an admin, watches bob's job's events through the router; a reload drops root's
    admin mark. On a server the stream ends (root may no longer see bob's job); through the
    router it ran on until bob's job ended: the node sees only the identity forwarded when
    the stream opened and knows nothing of admin marks."""
    tokens = token_file(tmp_path / "secrets")
    # another identity's job is 404 at once (in a router's first --reconnect-grace-seconds
    # it is 503 "not found yet", ROUTER §13)
    grace = ("--reconnect-grace-seconds", "0")
    router = start_router(tmp_path, "--auth-token-file", str(tokens), *grace, env=NODE_ENV)
    node = Node(tmp_path, router, "node-watched", NODE_ENV)
    watcher = http.client.HTTPConnection("127.0.0.1", router.port, timeout=30)
    try:
        ready_nodes(router, 1)
        url = router.url
        with kcoral.Client(url, token=TOKEN_B) as bob:
            job = bob.submit(module_program(WAIT, str(tmp_path / "go")))
            wait_for(lambda: job.status()["status"] == "RUNNING", "bob's job running", 60.0)
        path = f"/v1/jobs/{job.id}"
        watcher.request("GET", f"{path}/events", headers={"Authorization": f"Bearer {TOKEN_R}"})
        watching = watcher.getresponse()
        assert watching.status == 200

        _rewrite(tokens, f"alice {TOKEN_A}\nbob {TOKEN_B}\nroot {TOKEN_R}\n")
        assert 'admin_changed=["root"]' in _hang_up(router, "tokens_reloaded")
        watching.read()  # the stream ends (before: a timeout, bob's job still running)
        assert request(url, "GET", path, TOKEN_R).status == 404
        assert request(url, "GET", path, TOKEN_B).json["status"] == "RUNNING"
    finally:
        watcher.close()
        (tmp_path / "go").touch()
        node.stop()
        router.stop()


def test_a_request_that_reaches_a_node_after_its_identity_was_revoked_there_never_runs(
    tmp_path: Path,
) -> None:
    """The router checked alice's token, then a reload revoked it and the node heard so on a
    control slot before her request's head came on a worker slot (nothing orders the two).
    The node had none of her programs to cancel then, and ran this one for her. Played here
    at a node's server started as its supervisor starts it, with the router's side sent by
    the test: the revocation, then alice's head."""
    secret = "router-secret-for-this-test-0123456789"
    child, url = _node_child(tmp_path, secret)
    ran = tmp_path / "ran"
    try:
        revoked = _child_call(url, secret, "POST", "/v1/revocations/alice")
        assert revoked == (200, b'{"cancelled_programs":0,"ended_sessions":0}'), revoked
        late = _child_execute(url, secret, "alice", _raw(TOUCH, str(ran)))
        assert late[0] == 401, late
        assert json.loads(late[1])["error"]["message"] == "the token of identity alice was revoked"
        assert not ran.exists()
        assert _child_execute(url, secret, "bob", _raw("def f():\n    return 7\n"))[0] == 200
        listed = _child_call(url, secret, "GET", "/v1/revocations")
        assert json.loads(listed[1]) == {"working": [], "revoked": ["alice"]}
        # Listed again by a later reload, alice is served again.
        assert _child_call(url, secret, "DELETE", "/v1/revocations/alice")[0] == 200
        assert _child_execute(url, secret, "alice", _raw(TOUCH, str(ran)))[0] == 200
        assert ran.exists()
    finally:
        child.terminate()
        child.wait(30)


def _node_child(tmp_path: Path, secret: str) -> tuple[subprocess.Popen[bytes], str]:
    """A node's server as its supervisor starts it (secrets through a pipe), its tunnel
    aimed at a closed port; its URL once it listens."""
    ready = tmp_path / "child-ready"
    fd = write_secrets(NodeSecrets(None, secret, "slot-key-for-this-test"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCORAL_")}
    env.update(
        KCORAL_ROUTER_ENDPOINT=f"http://127.0.0.1:{_closed_port()}",
        KCORAL_NODE_ID="node-late",
        **{SECRETS_FD_ENV: str(fd)},
    )
    command = [sys.executable, "-m", "kcoral", "server", "--node-child", "--device", "cpu"]
    command += ["--host", "127.0.0.1", "--port", "0", "--ready-file", str(ready)]
    command += ["--sandbox", "none", "--log-dir", "", "--num-workers", "1"]
    command += ["--disk-cache-dir", str(tmp_path / "cache")]
    log = open(tmp_path / "child.log", "wb")
    try:
        child = subprocess.Popen(command, env=env, pass_fds=(fd,), stdout=log, stderr=log)
    finally:
        os.close(fd)
        log.close()
    wait_for(
        lambda: ready.exists() and bool(ready.read_text().strip()), "the child listening", 60.0
    )
    return child, ready.read_text().strip()


def _closed_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _child_call(
    url: str,
    secret: str,
    method: str,
    path: str,
    identity: str | None = None,
    body: bytes | None = None,
) -> tuple[int, bytes]:
    """One request to the node's server as its tunnel sends it: the router secret, and the
    caller's identity for a client's request (none for the router's own)."""
    host, port = url.split("://", 1)[1].rsplit(":", 1)
    headers = {"Authorization": f"Bearer {secret}"}
    if identity is not None:
        headers["X-KCoral-Identity"] = identity
    if body is not None:
        headers["Content-Type"] = f"multipart/form-data; boundary={BOUNDARY}"
    connection = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        connection.request(method, path, body=body, headers=headers)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def _child_execute(url: str, secret: str, identity: str, program: dict) -> tuple[int, bytes]:
    return _child_call(url, secret, "POST", "/execute", identity, _multipart_program(program))


def _multipart_program(program: dict) -> bytes:
    head = f'--{BOUNDARY}\r\nContent-Disposition: form-data; name="program"\r\n'
    data = f"{head}Content-Type: application/json\r\n\r\n".encode()
    return data + json.dumps(program).encode() + f"\r\n--{BOUNDARY}--\r\n".encode()


def test_a_revocation_reaches_a_node_whose_supervisor_alone_has_died(tmp_path: Path) -> None:
    """Its server runs on, and its jobs are still read through its control slots (ROUTER
    §13); a revocation must reach it too, or the revoked identity's job ran on there (the
    router told only nodes whose supervisor was connected; review)."""
    tokens = token_file(tmp_path / "secrets")
    router = start_router(tmp_path, "--auth-token-file", str(tokens), env=NODE_ENV)
    node = Node(tmp_path, router, "node-orphaned", NODE_ENV, "--num-workers", "1")
    server_pid = None
    try:
        ready_nodes(router, 1)
        server_pid = node.server_pid()
        with kcoral.Client(router.url, token=TOKEN_A) as alice:
            job = alice.submit(module_program(WAIT, str(tmp_path / "never")))
            wait_for(lambda: job.status()["status"] == "RUNNING", "alice's job running", 60.0)
        node.process.send_signal(signal.SIGKILL)  # the supervisor only
        node.process.wait(30)
        wait_for(lambda: "node_disconnected" in router.log(), "the node's loss", 60.0)
        _rewrite(tokens, f"bob {TOKEN_B}\nroot {TOKEN_R} admin\n")
        _hang_up(router, "tokens_reloaded")
        revoked = router.wait_log("identity_revoked")
        assert "identity_revoked identity=alice nodes=1" in revoked, revoked
        path = f"/v1/jobs/{job.id}"
        state = lambda: request(router.url, "GET", path, TOKEN_R).json["status"]  # noqa: E731
        wait_for(lambda: state() == "CANCELLED", "alice's job cancelled on the node", 60.0)
    finally:
        router.stop()
        if server_pid is not None:  # the orphaned server, which no supervisor stops now
            try:
                os.kill(server_pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
