"""A node token opens only its own node ids (issue 33, point 5: per-node tokens).

Attacker: a Slurm user (or a program on a node machine) who holds the node token of one
node, ``n-a``, and wants the clients' programs sent to another, ``n-b``: by claiming ``n-b``'s
id on a supervisor stream while it is absent, or by opening slots under ``n-b``'s id while it
serves. With one shared node token (ROUTER §3 before this) every holder could do both. Now
the router reads per-node tokens from ``--node-token-file`` (lines ``NODE_ID TOKEN``, or
``PREFIX* TOKEN``) and a token opens only the ids its line names, for the supervisor stream
and for the slots: another id is ``PERMISSION_DENIED`` and a ``node_token_refused`` WARNING.
Each test runs a real ``kcoral router`` process against in-process nodes over real gRPC.
"""

from __future__ import annotations

import asyncio
import sys
import uuid
from pathlib import Path

import grpc
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from kcoral_server.node.tunnel import auth_metadata, open_channel
from kcoral_server.proto import kcoral_gateway_pb2_grpc as pb_grpc
from kcoral_server.router.identity import parse_node_tokens
from kcoral_server.router.settings import SettingsError, parse_router_args
from router_helpers import (
    FakeNode,
    RouterProcess,
    http_request,
    rogue_slot,
    start_router,
    stream_status,
    wait_for_health,
)

TOKEN_A = "token-of-node-a-only"
TOKEN_B = "token-of-node-b-only"
TOKEN_ALICE = "token-of-alices-slurm-nodes"
SHARED = "the-one-shared-node-token"
SLOT_KEY = "n-b-slot-key"


def token_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / f"node-tokens-{uuid.uuid4().hex[:6]}"
    path.write_text(text)
    path.chmod(mode)
    return path


def started_router(tmp_path: Path, *extra: str, env: dict[str, str] | None = None):
    lines = f"n-a {TOKEN_A}\nn-b {TOKEN_B}\n# Slurm jobs of alice\nslurm-alice-* {TOKEN_ALICE}\n"
    path = token_file(tmp_path, lines)
    return start_router(
        tmp_path,
        "--status-check-interval-seconds",
        "0.2",
        "--node-token-file",
        str(path),
        *extra,
        env=env,
    )


def capacity(n: int):
    return lambda body: body["load"]["request_capacity"] >= n


async def claim(router: RouterProcess, node_id: str, token: str) -> grpc.StatusCode | None:
    """Open a supervisor stream for ``node_id`` with ``token``; the call's status (OK: acked)."""

    async def attempt() -> tuple[grpc.StatusCode | None, str]:
        node = FakeNode(router.port, node_id, slots=1, token=token)
        channel = open_channel(router.url)
        try:
            stub = pb_grpc.RouterGatewayStub(channel)
            call = stub.ConnectSupervisor(metadata=auth_metadata(token))
            await call.write(node.status())
            ack = await asyncio.wait_for(call.read(), 30)
            if ack is not grpc.aio.EOF:
                return grpc.StatusCode.OK, ""
            return await call.code(), await call.details() or ""
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or ""
        finally:
            await channel.close()

    return await stream_status(attempt)


def test_the_token_of_n_a_cannot_claim_the_id_of_an_absent_n_b(tmp_path: Path) -> None:
    router = started_router(tmp_path)

    async def scenario() -> None:
        assert await claim(router, "n-b", TOKEN_A) == grpc.StatusCode.PERMISSION_DENIED
        log = router.wait_log("node_token_refused")
        assert "node_token_refused" in log and "WARNING" in log and "node=n-b" in log
        assert TOKEN_A not in log, "the log shows a token"
        # n-b never connected: nothing serves, and the real n-b still gets its id.
        health = (await http_request(router.port, "GET", "/health")).json()
        assert health["load"]["request_capacity"] == 0
        real = FakeNode(router.port, "n-b", slots=1, token=TOKEN_B, slot_key=SLOT_KEY)
        await real.start()
        await wait_for_health(router.port, capacity(1))
        answer = await http_request(router.port, "POST", "/execute", b"for n-b")
        assert answer.status == 200 and answer.header("X-KCoral-Node") == "n-b"
        await real.close()

    try:
        asyncio.run(scenario())
    finally:
        router.stop()


def test_the_token_of_n_a_cannot_open_slots_of_a_serving_n_b_even_with_its_slot_key(
    tmp_path: Path,
) -> None:
    router = started_router(tmp_path)

    async def scenario() -> None:
        real = FakeNode(router.port, "n-b", slots=1, token=TOKEN_B, slot_key=SLOT_KEY)
        await real.start()
        mine = FakeNode(router.port, "n-a", slots=1, token=TOKEN_A)
        await mine.start()  # n-a's own token opens n-a
        await wait_for_health(router.port, capacity(2))
        code, received = await rogue_slot(
            router, "n-b", real.instance_id, token=TOKEN_A, slot_key=SLOT_KEY
        )
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert received == [], "the rogue slot was acknowledged or sent work"
        # A second supervisor stream for the serving n-b is refused on the token too.
        assert await claim(router, "n-b", TOKEN_A) == grpc.StatusCode.PERMISSION_DENIED
        served = set()
        for _ in range(6):
            answer = await http_request(router.port, "POST", "/execute", b"program")
            assert answer.status == 200 and answer.body == b"program"
            served.add(answer.header("X-KCoral-Node"))
        assert served <= {"n-a", "n-b"}
        assert len(real.requests) + len(mine.requests) == 6
        await mine.close()
        await real.close()

    try:
        asyncio.run(scenario())
    finally:
        router.stop()


def test_a_prefix_line_opens_the_ids_with_its_prefix_and_no_others(tmp_path: Path) -> None:
    router = started_router(tmp_path)

    async def scenario() -> None:
        job = FakeNode(router.port, "slurm-alice-4711-host1", slots=1, token=TOKEN_ALICE)
        await job.start()
        await wait_for_health(router.port, capacity(1))
        for other in ("slurm-bob-1", "n-a", "slurm-alic"):
            assert await claim(router, other, TOKEN_ALICE) == grpc.StatusCode.PERMISSION_DENIED
        code, _ = await rogue_slot(
            router, "n-a", job.instance_id, token=TOKEN_ALICE, slot_key=SLOT_KEY
        )
        assert code == grpc.StatusCode.PERMISSION_DENIED
        answer = await http_request(router.port, "POST", "/execute", b"x")
        assert answer.header("X-KCoral-Node") == "slurm-alice-4711-host1"
        await job.close()

    try:
        asyncio.run(scenario())
    finally:
        router.stop()


def test_an_unknown_token_is_unauthenticated_and_the_shared_token_still_opens_every_id(
    tmp_path: Path,
) -> None:
    router = started_router(tmp_path, env={"KCORAL_NODE_TOKEN": SHARED})

    async def scenario() -> None:
        assert await claim(router, "n-a", "a-guess") == grpc.StatusCode.UNAUTHENTICATED
        # An existing deployment's shared token keeps working beside the file.
        old = FakeNode(router.port, "any-node", slots=1, token=SHARED)
        await old.start()
        await wait_for_health(router.port, capacity(1))
        answer = await http_request(router.port, "POST", "/execute", b"x")
        assert answer.status == 200 and answer.header("X-KCoral-Node") == "any-node"
        await old.close()

    try:
        asyncio.run(scenario())
    finally:
        router.stop()


def test_a_node_token_file_open_to_others_or_writable_by_its_group_is_refused(
    tmp_path: Path,
) -> None:
    for mode in (0o604, 0o620, 0o602, 0o660):
        path = token_file(tmp_path, f"n-a {TOKEN_A}\n", mode)
        with pytest.raises(SettingsError, match="chmod 600"):
            parse_router_args(["--node-token-file", str(path)], {})
    path = token_file(tmp_path, f"n-a {TOKEN_A}\n", 0o400)
    settings = parse_router_args(
        ["--host", "0.0.0.0", "--allow-unauthenticated", "--node-token-file", str(path)], {}
    )
    assert settings.node_tokens is not None and settings.node_token is None
    assert TOKEN_A not in repr(settings)


def test_a_node_token_file_its_group_may_read_is_taken_as_a_kubernetes_secret_is_mounted(
    tmp_path: Path,
) -> None:
    """A Kubernetes Secret is mounted root-owned, 0440, for the pod's ``fsGroup``: the only
    way a router that is not root reads it. Refused, per-node tokens could not be used in a
    pod (deploy soak); the client-token file has always allowed it (EXTENSIONS §6)."""
    path = token_file(tmp_path, f"n-a {TOKEN_A}\n", 0o440)
    assert parse_router_args(["--node-token-file", str(path)], {}).node_tokens is not None


def test_a_router_off_loopback_accepts_a_node_token_file_as_its_node_token(tmp_path: Path) -> None:
    argv = ["--host", "0.0.0.0", "--allow-unauthenticated"]
    with pytest.raises(SettingsError, match="--node-token-file"):
        parse_router_args(argv, {})
    path = token_file(tmp_path, f"n-a {TOKEN_A}\n")
    assert parse_router_args([*argv, "--node-token-file", str(path)], {}).node_tokens


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("", "holds no"),
        ("# only a comment\n", "holds no"),
        ("n-a\n", "line 1: expected"),
        ("n-a t1 extra\n", "line 1: expected"),
        ("n-a t1\n-bad t2\n", "line 2: invalid node id"),
        ("* t1\n", "'\\*' alone"),
        ("n-a t1\nn-b t1\n", "line 2: this token is already used"),
        ("n-a t1\nn-a t2\n", "lines 1 and 2 open the same node ids"),
        ("slurm-* t1\nn-a t3\nslurm-alice-1 t2\n", "lines 1 and 3 open the same node ids"),
        ("slurm-a* t1\nslurm-* t2\n", "lines 1 and 2 open the same node ids"),
    ],
)
def test_a_bad_node_token_file_is_refused_naming_its_line(
    tmp_path: Path, text: str, problem: str
) -> None:
    with pytest.raises(ValueError, match=problem):
        parse_node_tokens(text)
    path = token_file(tmp_path, text)
    with pytest.raises(SettingsError, match="--node-token-file"):
        parse_router_args(["--node-token-file", str(path)], {})


def test_an_empty_node_token_file_option_is_refused() -> None:
    with pytest.raises(SettingsError, match="must not be empty"):
        parse_router_args(["--node-token-file", ""], {})
