"""Requests that say what they need (EXTENSIONS §14, ROUTER §6, §7, §13) through a real router
onto three real nodes: ``cpu-a`` (a CPU node, the default kind, ``pool=small``), ``fake-a``
(two fake GPUs, ``pool=big``) and ``fake-b`` (one fake GPU).

A selector takes ``/execute``, jobs, sessions and remote functions only to nodes that fit
it, a routing preference never overrides it, a cache-miss retry keeps it, one that no ready
node offers is refused at once naming what the fleet offers, a malformed one is a ``400``;
sessions land only on nodes with enough GPUs, a session's programs must fit its node, and a
``node=`` selector does not open another caller's session. Only the canonical form of a
selector is logged."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator

import pytest
from raw_http import call_program, execute_body, post_execute, request
from router_helpers import Node, RouterProcess, http_request, start_router, stopping
from waiting import wait_for

import kcoral
from kcoral.errors import KCoralError

pytestmark = pytest.mark.slow
ALICE, BOB = "alice-select-token", "bob-select-token"
NODES_ENV = {"KCORAL_NODE_TOKEN": "routed-node-token"}
FAKE = ("--device", "fake-gpu", "--workers-per-gpu", "1")
SOURCE = "import os\n\ndef main():\n    return os.getpid()\n"
MARKER = "zz-raw-selector-text"


def ready(router: RouterProcess) -> set[str]:
    """The nodes whose latest node_state line says ``ready``."""
    states: dict[str, str] = {}
    for line in router.log().splitlines():
        if "node_state" in line and "node=" in line and " state=" in line:
            states[line.split("node=")[1].split()[0]] = line.split(" state=")[1].split()[0]
    return {node for node, state in states.items() if state == "ready"}


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RouterProcess]:
    tmp = tmp_path_factory.mktemp("selectors")
    tokens = tmp / "client-tokens"
    tokens.write_text(f"alice {ALICE}\nbob {BOB}\n")
    router = start_router(
        tmp,
        "--status-check-interval-seconds",
        "0.3",
        "--auth-token-file",
        str(tokens),
        # another identity's job or session is 404 at once, as an unknown id (in a router's
        # first --reconnect-grace-seconds both are 503 "not found yet", ROUTER §13)
        "--reconnect-grace-seconds",
        "0",
        env=NODES_ENV,
    )
    nodes = [Node(tmp, router, "cpu-a", NODES_ENV, "--node-label", "pool=small")]
    with stopping(router, nodes):
        # the first ready node's kind (cpu) is the default kind
        wait_for(lambda: "cpu-a" in ready(router), "cpu-a ready", 120.0, detail=router.log)
        nodes.append(
            Node(
                tmp,
                router,
                "fake-a",
                NODES_ENV,
                *FAKE,
                "--fake-gpu-count",
                "2",
                "--node-label",
                "pool=big",
            )
        )
        nodes.append(Node(tmp, router, "fake-b", NODES_ENV, *FAKE, "--fake-gpu-count", "1"))
        wait_for(
            lambda: ready(router) >= {"fake-a", "fake-b"},
            "fake nodes ready",
            120.0,
            detail=router.log,
        )
        yield router


def program() -> kcoral.Program:
    built = kcoral.Program()
    module = built.upload(kind="module", source=SOURCE)
    built.return_(key="r", value=built.run(fn=built.get_function(module=module, name="main")))
    return built


def refusal(call) -> KCoralError:
    with pytest.raises(KCoralError) as raised:
        call()
    return raised.value


def test_requests_with_a_selector_go_only_to_the_nodes_that_fit_it(fleet: RouterProcess) -> None:
    with kcoral.Client(fleet.url, token=ALICE) as client:
        assert {client.execute(program(), select="gpu=fake").node for _ in range(6)} <= {
            "fake-a",
            "fake-b",
        }
        assert client.execute(program(), select={"gpu": "cpu"}).node == "cpu-a"
        assert client.execute(program(), select={"gpus": 2}).node == "fake-a"
        assert client.execute(program(), select="pool=big").node == "fake-a"
        assert client.execute(program(), select="node=fake-b").node == "fake-b"
        # without a selector: the default kind, as every published client always did
        assert {client.execute(program()).node for _ in range(3)} == {"cpu-a"}
        job = client.submit(program(), select={"node": "fake-b"})
        assert job.result(timeout=60).node == "fake-b"

        @client.function(select="gpu=fake,gpus=2")
        def add_one(x: int) -> int:
            return x + 1

        called = add_one.execute(1)
        assert called.node == "fake-a" and called["output"] == 2

    async def from_async() -> str | None:
        async with kcoral.AsyncClient(fleet.url, token=ALICE) as client:
            return (await client.execute(program(), select="node=fake-a")).node

    assert asyncio.run(from_async()) == "fake-a"


def test_a_selector_no_ready_node_offers_is_refused_at_once_naming_the_offers(
    fleet: RouterProcess,
) -> None:
    with kcoral.Client(fleet.url, token=ALICE) as client:
        for call in (
            lambda: client.execute(program(), select="gpu=h100"),
            lambda: client.submit(program(), select="gpu=h100"),
            lambda: client.session(select="gpu=h100"),
        ):
            refused = refusal(call)
            assert (refused.status_code, refused.kind) == (503, "no_matching_node")
            message = str(refused)
            assert "no ready node offers the selector gpu=h100" in message
            for offer in (
                "gpu=cpu,gpus=0: 1 node",
                "gpu=fake,gpus=1: 1 node",
                "gpu=fake,gpus=2: 1 node",
                "pool=big: 1 node",
                "pool=small: 1 node",
            ):
                assert offer in message
        assert refusal(lambda: client.execute(program(), select="gpus=3")).kind == (
            "no_matching_node"
        )


def test_a_routing_preference_never_overrides_a_selector(fleet: RouterProcess) -> None:
    auth = {"Authorization": f"Bearer {ALICE}"}
    for preferred, select, served in (
        ("cpu-a", "node=fake-b", "fake-b"),
        ("fake-b", "gpus=2", "fake-a"),
        ("fake-a", "gpu=cpu", "cpu-a"),
    ):
        answer = post_execute(
            fleet.url,
            call_program(SOURCE),
            headers={**auth, "X-KCoral-Node": preferred, "X-KCoral-Select": select},
        )
        assert answer.status == 200 and answer.body["status"] == "COMPLETED", answer.raw[:300]
        assert answer.headers["X-KCoral-Node"] == served


def test_a_cache_miss_retry_keeps_its_selector(fleet: RouterProcess) -> None:
    """Without its selector the retry would go to the default kind (the X-KCoral-Node echo of
    a node of another kind is not followed): only a kept selector ends on fake-b."""
    unique = os.urandom(32)
    built = program()
    built.upload(kind="bytes", value=unique)  # a blob no node has seen: a CACHE_MISS first
    seen = fleet.lines_after_mark(ALICE)  # the previous test's last line is in by now
    with kcoral.Client(fleet.url, token=ALICE) as client:
        result = client.execute(built, select="node=fake-b")
    assert result.completed and result.node == "fake-b"

    def finished() -> list[str]:
        lines = fleet.log().splitlines()[seen:]
        return [line for line in lines if "request_finished" in line]

    lines = wait_for(
        lambda: len(finished()) >= 2 and finished(), "both attempts", 120.0, detail=fleet.log
    )
    # the CACHE_MISS answer and the retry, both with the selector, both on fake-b
    assert len(lines) == 2
    assert all(" node=fake-b " in line and "select=node=fake-b" in line for line in lines)


def test_a_malformed_selector_is_a_400_and_only_canonical_selectors_are_logged(
    fleet: RouterProcess,
) -> None:
    auth = ("Authorization", f"Bearer {ALICE}")
    content_type, body = execute_body(call_program(SOURCE))
    for headers in (
        [("X-KCoral-Select", MARKER)],
        [("X-KCoral-Select", f"gpu={MARKER}!")],
        [("X-KCoral-Select", "gpu=fake"), ("X-KCoral-Select", "gpus=1")],
    ):
        for path in ("/execute", "/v1/jobs"):
            answer = request(
                fleet.url, "POST", path, body, [auth, ("Content-Type", content_type), *headers]
            )
            assert answer.status == 400, answer.raw
            assert answer.body["error"]["kind"] == "invalid_selector"
        created = request(fleet.url, "POST", "/v1/sessions", b"{}", [auth, *headers])
        assert created.status == 400 and created.body["error"]["kind"] == "invalid_selector"
    spaced = post_execute(
        fleet.url,
        call_program(SOURCE),
        headers={auth[0]: auth[1], "X-KCoral-Select": " pool = big ,  gpu=fake "},
    )
    assert spaced.status == 200 and spaced.headers["X-KCoral-Node"] == "fake-a"
    log = fleet.wait_log("select=gpu=fake,pool=big")
    assert "select=gpu=fake,pool=big" in log
    assert MARKER not in log and "pool = big" not in log


def test_sessions_land_only_on_nodes_with_enough_gpus(fleet: RouterProcess) -> None:
    """fake-a and fake-b have one free seat each; a tie would go to the greater id, fake-b,
    whose one GPU would refuse a two-GPU session."""
    with kcoral.Client(fleet.url, token=ALICE) as client:
        with client.session(gpu_count=2, select="gpu=fake") as session:
            node = client.request("GET", f"/v1/sessions/{session.id}").headers["X-KCoral-Node"]
            assert node == "fake-a"
            assert session.execute(program()).node == "fake-a"  # its programs go there too
        # none has enough: the one with the most says how many it has, as before
        too_many = refusal(lambda: client.session(gpu_count=3, select="gpu=fake"))
        assert (too_many.status_code, too_many.kind) == (400, "parse")
        assert "exceeds this server's GPU count (2)" in str(too_many)
        # without a selector: the default kind (cpu), which has no GPUs for such a session
        no_gpus = refusal(lambda: client.session(gpu_count=2))
        assert no_gpus.status_code == 400 and "needs a GPU server" in str(no_gpus)
        with client.session() as plain:  # and a plain session lands as it always did
            assert plain.execute(program()).node == "cpu-a"


def test_a_program_asking_for_gpus_goes_only_to_nodes_that_have_them(
    fleet: RouterProcess,
) -> None:
    """A program's options.gpu_count takes it only to nodes with that many GPUs (ROUTER §7):
    before, every other two-GPU program of gpu=fake went to fake-b and got its 400."""
    with kcoral.Client(fleet.url, token=ALICE) as client:
        placed = [client.execute(program(), select="gpu=fake", gpu_count=2) for _ in range(6)]
        assert [(run.status, run.node) for run in placed] == [("COMPLETED", "fake-a")] * 6
        job = client.submit(program(), select="gpu=fake", gpu_count=2)
        assert job.result(timeout=60).node == "fake-a"
        # one GPU: both fit, as before (which one a program goes to is the router's choice:
        # the one-GPU node is shown to take it by naming it)
        ones = [client.execute(program(), select="gpu=fake", gpu_count=1) for _ in range(4)]
        assert all(run.completed for run in ones) and {r.node for r in ones} <= {"fake-a", "fake-b"}
        assert client.execute(program(), select="node=fake-b", gpu_count=1).node == "fake-b"
        # none has enough: a node's own 400 says so, as before
        too_many = refusal(lambda: client.execute(program(), select="gpu=fake", gpu_count=3))
        assert (too_many.status_code, too_many.kind) == (400, "parse")


def test_a_sessions_programs_must_fit_its_node_and_a_selector_opens_no_other_session(
    fleet: RouterProcess,
) -> None:
    with kcoral.Client(fleet.url, token=ALICE) as alice:
        with alice.session(select="node=fake-b") as session:
            assert session.execute(program()).node == "fake-b"
            assert session.execute(program(), select="gpu=fake").node == "fake-b"
            mismatch = refusal(lambda: session.execute(program(), select="gpus=2"))
            assert (mismatch.status_code, mismatch.kind) == (409, "selector_mismatch")
            assert "the session runs on node fake-b" in str(mismatch)
            assert refusal(lambda: session.submit(program(), select="node=fake-a")).kind == (
                "selector_mismatch"
            )
            content_type, body = execute_body(call_program(SOURCE))
            for suffix in ("/execute", "/jobs"):
                for select in ("node=fake-b", "gpu=fake", "node=fake-a"):
                    answer = request(
                        fleet.url,
                        "POST",
                        f"/v1/sessions/{session.id}{suffix}",
                        body,
                        [
                            ("Authorization", f"Bearer {BOB}"),
                            ("Content-Type", content_type),
                            ("X-KCoral-Select", select),
                        ],
                    )
                    assert answer.status == 404, answer.raw
                    assert answer.body["error"]["kind"] == "not_found"
            assert session.execute(program()).completed  # alice's session is untouched


def test_a_session_body_is_read_whole_for_its_gpu_count_chunked_or_not_and_bounded(
    fleet: RouterProcess,
) -> None:
    auth = ("Authorization", f"Bearer {ALICE}")
    body = b'{"gpu_count": 2}'
    chunked = asyncio.run(
        http_request(
            fleet.port,
            "POST",
            "/v1/sessions",
            headers=[auth, ("Content-Type", "application/json"), ("X-KCoral-Select", "gpu=fake")],
            chunks=[body[:5], body[5:]],
        )
    )
    assert chunked.status == 201, chunked.body
    assert chunked.header("X-KCoral-Node") == "fake-a"
    session_id = chunked.json()["session_id"]
    ended = request(fleet.url, "DELETE", f"/v1/sessions/{session_id}", headers=[auth])
    assert ended.status == 200 and ended.body["state"] == "ENDED"
    too_large = request(fleet.url, "POST", "/v1/sessions", b" " * 70_000, [auth])
    assert too_large.status == 413 and too_large.body["error"]["kind"] == "request_too_large"
