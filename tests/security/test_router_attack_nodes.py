"""Attacks on a router by whoever can reach its gRPC side or plays a node (issue 16, 5a–5c).

Attackers: a *rogue node* (a process that connects as a supervisor, with or without the node
token) and a *token holder* who tries to speak for another identity. Each test runs a real
``kcoral router`` process against in-process fake nodes (``tests/router/router_helpers``).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from kcoral_server.node.tunnel import auth_metadata, open_channel
from kcoral_server.proto import kcoral_gateway_pb2 as pb
from kcoral_server.proto import kcoral_gateway_pb2_grpc as pb_grpc
from router_helpers import (
    FakeNode,
    RouterProcess,
    http_request,
    start_router,
    stream_status,
    wait_for_health,
)

NODE_TOKEN = "node-token-for-tests"
ALICE, BOB = "alice-client-token", "bob-client-token"


def capacity(n: int):
    return lambda body: body["load"]["request_capacity"] >= n


def router_exit(tmp_path: Path, *args: str, env: dict[str, str] | None = None):
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KCORAL_")}
    environment.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "kcoral", "router", "--port", "0", *args],
        env=environment,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )


def test_a_router_with_a_client_token_or_off_loopback_refuses_to_start_without_a_node_token(
    tmp_path: Path,
) -> None:
    token_file = tmp_path / "clients"
    token_file.write_text(f"alice {ALICE}\n")
    for args in (
        ["--auth-token-file", str(token_file)],  # loopback, but clients must authenticate
        ["--host", "0.0.0.0", "--auth-token-file", str(token_file)],
        ["--host", "0.0.0.0", "--allow-unauthenticated"],
    ):
        finished = router_exit(tmp_path, *args)
        assert finished.returncode == 2, (args, finished.stderr)
        assert "--allow-unauthenticated-nodes" in finished.stderr
        assert "KCORAL_NODE_TOKEN" in finished.stderr


def test_a_node_token_that_grpc_cannot_carry_is_refused_at_start_by_router_and_node(
    tmp_path: Path,
) -> None:
    # A token file written with `echo` ends in a newline. The router took such a token, and
    # a node that had it failed inside gRPC on every stream, retrying without end; both now
    # refuse it at start, saying why.
    refused = "must be printable ASCII without spaces (a trailing newline?)"
    finished = router_exit(tmp_path, env={"KCORAL_NODE_TOKEN": NODE_TOKEN + "\n"})
    assert finished.returncode == 2 and refused in finished.stderr, finished.stderr
    per_node = tmp_path / "node-tokens"
    per_node.write_text("slurm-* t\u00f6ken\n")
    per_node.chmod(0o600)
    finished = router_exit(tmp_path, "--node-token-file", str(per_node))
    assert finished.returncode == 2 and refused in finished.stderr, finished.stderr
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KCORAL_")}
    node_args = ["--router", "http://127.0.0.1:9", "--node-id", "n1", "--device", "cpu"]
    node = subprocess.run(
        [sys.executable, "-m", "kcoral", "server", *node_args, "--port", "0", "--log-dir", ""],
        env={**environment, "KCORAL_NODE_TOKEN": NODE_TOKEN + "\n"},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
    )
    assert node.returncode == 2 and refused in node.stderr, node.stderr


def test_an_explicit_opt_out_accepts_unauthenticated_nodes_with_a_warning(tmp_path: Path) -> None:
    router = start_router(
        tmp_path, "--allow-unauthenticated-nodes", env={"KCORAL_AUTH_TOKEN": ALICE}
    )
    try:
        log = router.wait_log("unauthenticated_nodes")
        assert "WARNING" in log and "unauthenticated_nodes" in log
    finally:
        router.stop()


def test_a_loopback_router_without_a_token_says_at_start_who_can_reach_it(tmp_path: Path) -> None:
    # Loopback keeps web pages out, not the machine's other users: without a client token
    # any of them could send programs through it, and without a node token serve as a node
    # and receive everyone's programs; nothing said so.
    def said_at_start(env: dict[str, str]) -> str | None:
        router = start_router(tmp_path, env=env)
        try:
            router.wait_log("listening on")
            lines = router.log().splitlines()
        finally:
            router.stop()
        said = [x.split(None, 2)[1:] for x in lines if " unauthenticated_access " in x]
        assert len(said) <= 1 and all(level == "INFO" for level, _ in said), said
        return said[0][1] if said else None

    assert said_at_start({"KCORAL_AUTH_TOKEN": "", "KCORAL_TOKEN": ""}) == (
        "unauthenticated_access host=127.0.0.1 message='no client or node token: any local"
        " user can send programs here or serve as a node; set both on a shared machine'"
    )
    assert said_at_start({"KCORAL_AUTH_TOKEN": "", "KCORAL_NODE_TOKEN": "a-node-token"}) == (
        "unauthenticated_access host=127.0.0.1 message='no client token: any local user can"
        " send programs through this router; on a shared machine, give --auth-token-file'"
    )
    tokens = {"KCORAL_AUTH_TOKEN": ALICE, "KCORAL_NODE_TOKEN": "a-node-token"}
    assert said_at_start(tokens) is None


def test_a_token_in_the_clients_variable_is_said_not_to_protect_the_router(tmp_path) -> None:
    # `KCORAL_TOKEN=s3cret kcoral router` (the clients' variable) asked no token of anyone
    router = start_router(tmp_path, env={"KCORAL_AUTH_TOKEN": "", "KCORAL_TOKEN": ALICE})
    try:
        router.wait_log("listening on")
        lines = router.log().splitlines()
    finally:
        router.stop()
    [line] = [x for x in lines if " unauthenticated_access " in x]
    assert " WARNING " in line and ALICE not in router.log(), line
    assert line.endswith(
        "message='KCORAL_TOKEN is set but only clients read it: no token is required; give it"
        " as KCORAL_AUTH_TOKEN or --auth-token-file'"
    ), line


async def claim(router: RouterProcess, node_id: str, token: str | None) -> grpc.StatusCode | None:
    """A second supervisor stream for ``node_id``; the status code it ends with."""

    async def attempt() -> tuple[grpc.StatusCode | None, str]:
        channel = open_channel(router.url)
        try:
            stub = pb_grpc.RouterGatewayStub(channel)
            call = stub.ConnectSupervisor(metadata=auth_metadata(token))
            rogue = FakeNode(router.port, node_id)
            try:
                await call.write(rogue.status())
                answer = await asyncio.wait_for(call.read(), 10)
            except grpc.aio.AioRpcError as exc:
                return exc.code(), exc.details() or ""
            assert answer is grpc.aio.EOF, "the claim was acknowledged"
            return await call.code(), await call.details() or ""
        finally:
            await channel.close()

    return await stream_status(attempt)


def test_a_rogue_supervisor_cannot_take_a_live_nodes_id_and_gets_no_client_traffic(
    tmp_path: Path,
) -> None:
    # The rogue even holds the node token (a copied credential, or a node started twice).
    router = start_router(
        tmp_path, "--status-check-interval-seconds", "0.2", env={"KCORAL_NODE_TOKEN": NODE_TOKEN}
    )

    async def scenario() -> None:
        real = FakeNode(router.port, "gpu-1", slots=2, token=NODE_TOKEN)
        await real.start()
        await wait_for_health(router.port, capacity(2))
        assert await claim(router, "gpu-1", NODE_TOKEN) == grpc.StatusCode.ALREADY_EXISTS
        # The rogue's slots name its own server instance: they are never given work.
        rogue = FakeNode(router.port, "gpu-1", slots=2, token=NODE_TOKEN)
        rogue.channel = open_channel(router.url)
        rogue.stub = pb_grpc.RouterGatewayStub(rogue.channel)
        for _ in range(2):
            await rogue.open_slot()
        for _ in range(8):
            answer = await http_request(router.port, "POST", "/execute", b"secret program")
            assert answer.status == 200 and answer.header("X-KCoral-Node") == "gpu-1"
        assert rogue.requests == [] and len(real.requests) == 8
        health = await wait_for_health(router.port, capacity(2))
        assert health["status"] == "ok"
        # Read while both nodes are still connected: closing them below logs disconnects.
        log = router.wait_log("node_claim_refused")
        assert "node_claim_refused" in log and "WARNING" in log
        assert "node_disconnected" not in log  # the real node was never replaced
        await rogue.close()
        await real.close()

    try:
        asyncio.run(scenario())
    finally:
        router.stop()


def test_a_node_whose_old_stream_went_silent_gets_back_in_at_once(tmp_path: Path) -> None:
    router = start_router(
        tmp_path,
        "--status-check-interval-seconds",
        "0.2",
        "--max-status-age-seconds",
        "1",
        "--node-retention-seconds",
        "60",
    )

    async def scenario() -> None:
        old = FakeNode(router.port, "gpu-1")
        await old.start()
        await wait_for_health(router.port, capacity(1))
        # Half-open: the old stream stays open but sends nothing more (a network cut the
        # router has not noticed); after the status age a reconnect must get in.
        for task in old.tasks[:1]:
            task.cancel()
        await asyncio.sleep(1.5)
        new = FakeNode(router.port, "gpu-1")
        await new.start()  # acknowledged (FakeNode.start asserts the ack)
        # the silent stream's call ends at once, not when (if ever) it sends again
        code = await asyncio.wait_for(old.supervisor.code(), 10)
        assert code == grpc.StatusCode.FAILED_PRECONDITION
        assert "superseded" in await old.supervisor.details()
        await wait_for_health(router.port, lambda b: b["status"] == "ok")
        answer = await http_request(router.port, "POST", "/execute", b"x")
        assert answer.status == 200 and new.requests
        await new.close()
        await old.close()

    try:
        asyncio.run(scenario())
    finally:
        router.stop()


def seen_headers(answer) -> list[tuple[str, str]]:
    return [(n.lower(), v) for n, v in json.loads(answer.body)]


def test_a_rogue_node_sees_no_client_token_origin_or_cookie_only_the_routers_identity(
    tmp_path: Path,
) -> None:
    clients = tmp_path / "clients"
    clients.write_text(f"alice {ALICE}\nbob {BOB} admin\n")
    router = start_router(
        tmp_path,
        "--auth-token-file",
        str(clients),
        "--allowed-origin",
        "https://notebook.example",
        env={"KCORAL_NODE_TOKEN": NODE_TOKEN},
    )
    heads: list[pb.RequestHead] = []

    async def logging_node(head: pb.RequestHead, body: bytes):
        heads.append(head)  # what a rogue node would write to its log
        pseudo = {h.name: h.value for h in head.headers}
        if pseudo.get(b":path") == b"/v1/jobs":
            return 200, [(b"content-type", b"application/json")], b"[]"
        seen = json.dumps([[h.name.decode(), h.value.decode()] for h in head.headers])
        return 200, [(b"content-type", b"application/json")], seen.encode()

    async def scenario() -> None:
        node = FakeNode(
            router.port, "rogue", token=NODE_TOKEN, control_slots=1, handler=logging_node
        )
        await node.start()
        await wait_for_health(router.port, capacity(1))
        answer = await http_request(
            router.port,
            "POST",
            "/execute",
            b"x",
            [
                ("Authorization", f"Bearer {ALICE}"),
                ("Origin", "https://notebook.example"),
                ("Cookie", "session=abc"),
                ("X-KCoral-Identity", "bob;admin"),  # alice pretending to be the admin
            ],
        )
        assert answer.status == 200, answer.body
        headers = seen_headers(answer)
        names = [n for n, _ in headers]
        for leaked in ("authorization", "origin", "cookie"):
            assert leaked not in names
        assert [v for n, v in headers if n == "x-kcoral-identity"] == ["alice"]
        admin = await http_request(
            router.port, "POST", "/execute", b"x", [("Authorization", f"Bearer {BOB}")]
        )
        assert [v for n, v in seen_headers(admin) if n == "x-kcoral-identity"] == ["bob;admin"]
        listed = await http_request(
            router.port, "GET", "/v1/jobs", headers=[("Authorization", f"Bearer {ALICE}")]
        )
        assert listed.status == 200
        await node.close()

    try:
        asyncio.run(scenario())
    finally:
        router.stop()
    assert heads
    for head in heads:
        values = b" ".join(h.name + b"=" + h.value for h in head.headers)
        assert ALICE.encode() not in values and BOB.encode() not in values
        assert b"authorization" not in [h.name.lower() for h in head.headers]


def test_a_router_without_client_tokens_names_every_caller_default(tmp_path: Path) -> None:
    router = start_router(tmp_path)

    async def scenario() -> None:
        node = FakeNode(router.port, "n1")
        await node.start()
        await wait_for_health(router.port, capacity(1))
        answer = await http_request(
            router.port, "POST", "/execute", b"x", [("X-KCoral-Identity", "root;admin")]
        )
        assert answer.status == 200
        (head,) = node.heads
        identities = [h.value for h in head.headers if h.name == b"x-kcoral-identity"]
        assert identities == [b"default"]
        await node.close()

    try:
        asyncio.run(scenario())
    finally:
        router.stop()


def test_a_nodes_unreadable_revocation_account_teaches_the_router_nothing_and_breaks_nothing(
    tmp_path: Path,
) -> None:
    """A router with a token file asks each node that connects which identities have work
    there (``GET /v1/revocations``, ROUTER §3). A rogue node answers JSON nested deeper than
    the parser goes: the router read it with ``json.loads``, whose ``RecursionError`` ended
    its task with a traceback in the log; the answer now reads as nothing, as any node
    answer the router cannot read."""
    tokens = tmp_path / "clients"
    tokens.write_text(f"alice {ALICE}\nbob {BOB}\n")
    os.chmod(tokens, 0o600)
    router = start_router(
        tmp_path, "--auth-token-file", str(tokens), env={"KCORAL_NODE_TOKEN": NODE_TOKEN}
    )

    async def scenario() -> None:
        asked = asyncio.Event()

        async def deep_account(head: pb.RequestHead, body: bytes):
            if any(h.name == b":path" and h.value == b"/v1/revocations" for h in head.headers):
                asked.set()
                return 200, [(b"content-type", b"application/json")], b"[" * 100_000
            return 200, [(b"content-type", b"application/json")], b"{}"

        rogue = FakeNode(
            router.port, "rogue", control_slots=1, token=NODE_TOKEN, handler=deep_account
        )
        await rogue.start()
        await asyncio.wait_for(asked.wait(), 30)
        # The node's one control slot serves this only once the router has the account
        # (and has read it: nothing runs between the answer and its reading).
        await wait_for_health(router.port, capacity(1))
        auth = [("Authorization", f"Bearer {ALICE}")]
        assert (await http_request(router.port, "GET", "/v1/info", headers=auth)).status == 200
        await rogue.close()

    try:
        asyncio.run(scenario())
        router.lines_after_mark(ALICE)  # every line the answer caused is in the log
        assert "Traceback" not in router.log(), router.log()
        assert router.process.poll() is None
    finally:
        router.stop()
