"""A direct server matches a selector against itself (EXTENSIONS §14): a real server with two
fake GPUs runs what fits it (and names no node), answers ``503 no_matching_node`` saying what
it offers for what does not, ``400 invalid_selector`` for a malformed header (whose text it
never logs), and ``409 selector_mismatch`` for a session's program its session's server
does not fit; another caller's session stays a ``404`` whatever the selector."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from kcoral_server.front_door.app import create_app
from kcoral_server.front_door.node_fit import describe_offers, logged, selector_refusal
from kcoral_server.settings.config import ServerConfig
from raw_http import call_program, execute_body, post_execute, request
from server_process import RunningServer, running_server

import kcoral
from kcoral.errors import KCoralError

ALICE, BOB = "alice-selector-token", "bob-selector-token"
SOURCE = "def main():\n    return 7\n"
MARKER = "zz-raw-selector-text"
FAKE_GPUS = ["--device", "fake-gpu", "--fake-gpu-count", "2", "--workers-per-gpu", "1"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    directory = tmp_path_factory.mktemp("selectors")
    tokens = directory / "tokens"
    tokens.write_text(f"alice {ALICE}\nbob {BOB}\n")
    tokens.chmod(0o600)
    args = [*FAKE_GPUS, "--auth-token-file", str(tokens), "--max-sessions", "2"]
    with running_server(directory / "server", args) as running:
        yield running


def program() -> kcoral.Program:
    built = kcoral.Program()
    module = built.upload(kind="module", source=SOURCE)
    built.return_(key="r", value=built.run(fn=built.get_function(module=module, name="main")))
    return built


def refusal(call) -> KCoralError:
    with pytest.raises(KCoralError) as raised:
        call()
    return raised.value


def test_a_direct_server_runs_what_fits_it_and_names_no_node(server: RunningServer) -> None:
    with kcoral.Client(server.url, token=ALICE) as client:
        for select in ("gpu=fake,gpus=2", {"arch": "sm_90a", "gpus": 1}, None):
            result = client.execute(program(), select=select)
            assert result.completed and result["r"] == 7
            assert result.node is None  # a direct server names no node


def test_a_direct_server_refuses_what_does_not_fit_saying_what_it_offers(
    server: RunningServer,
) -> None:
    with kcoral.Client(server.url, token=ALICE) as client:
        unfit = refusal(lambda: client.execute(program(), select={"gpu": "h100"}))
        assert (unfit.status_code, unfit.kind) == (503, "no_matching_node")
        assert "does not fit the selector gpu=h100" in str(unfit)
        assert "it offers gpu=fake, arch=sm_90a, gpus=2" in str(unfit)
        for select in ("gpus=3", "node=n-1", "pool=big"):
            assert refusal(lambda s=select: client.execute(program(), select=s)).kind == (
                "no_matching_node"
            )
        assert refusal(lambda: client.submit(program(), select="gpus=3")).status_code == 503
        assert refusal(lambda: client.session(select="gpu=h100")).kind == "no_matching_node"
        assert client.execute(program()).completed  # and it keeps serving


def test_a_malformed_selector_header_is_a_400_whose_text_is_never_logged(
    server: RunningServer,
) -> None:
    auth = ("Authorization", f"Bearer {ALICE}")
    content_type, body = execute_body(call_program(SOURCE))
    for headers in (
        [("X-KCoral-Select", f"{MARKER}")],
        [("X-KCoral-Select", "gpu=fake"), ("X-KCoral-Select", "gpus=1")],
        [("X-KCoral-Select", f"gpu={MARKER}!")],
    ):
        for path in ("/execute", "/v1/jobs"):
            answer = request(
                server.url, "POST", path, body, [auth, ("Content-Type", content_type), *headers]
            )
            assert answer.status == 400, answer.raw
            assert answer.body["error"]["kind"] == "invalid_selector"
        created = request(server.url, "POST", "/v1/sessions", b"{}", [auth, *headers])
        assert created.status == 400 and created.body["error"]["kind"] == "invalid_selector"
    told = post_execute(
        server.url,
        call_program(SOURCE),
        headers={"X-KCoral-Select": "gpu", "Authorization": f"Bearer {ALICE}"},
    )
    assert "selector part 'gpu' must be key=value" in told.body["error"]["message"]
    refused = [
        r
        for r in server.events()
        if r.get("event") == "request_finished" and r.get("error_kind") == "invalid_selector"
    ]
    assert len(refused) >= 6
    for path in server.log_dir.rglob("*"):
        if path.is_file():
            assert MARKER not in path.read_text(errors="replace"), path
    assert MARKER not in server.stderr()
    served = post_execute(
        server.url, call_program(SOURCE), headers={"Authorization": f"Bearer {ALICE}"}
    )
    assert served.body["status"] == "COMPLETED"  # the server keeps serving


def test_a_sessions_program_must_fit_its_server_and_another_callers_session_stays_unknown(
    server: RunningServer,
) -> None:
    with kcoral.Client(server.url, token=ALICE) as alice:
        with alice.session(gpu_count=2, select={"gpus": 2}) as session:
            assert session.execute(program()).completed  # its selector goes along, and fits
            mismatch = refusal(lambda: session.execute(program(), select="gpu=h100"))
            assert (mismatch.status_code, mismatch.kind) == (409, "selector_mismatch")
            assert "a session's programs run where the session is" in str(mismatch)
            path = f"/v1/sessions/{session.id}/execute"
            content_type, body = execute_body(call_program(SOURCE))
            for select in ("gpu=fake", "node=anything", "gpu=h100"):
                answer = request(
                    server.url,
                    "POST",
                    path,
                    body,
                    [
                        ("Authorization", f"Bearer {BOB}"),
                        ("Content-Type", content_type),
                        ("X-KCoral-Select", select),
                    ],
                )
                assert answer.status == 404 and answer.body["error"]["kind"] == "not_found"
        ended = refusal(lambda: session.execute(program(), select="gpu=h100"))
        assert (ended.status_code, ended.kind) == (410, "session_ended")  # ended comes first


def test_a_routers_node_offers_its_node_id_and_labels_too() -> None:
    """Decision logic on the server's own state (a node's child is reached only through its
    router, which keeps the header to itself; the routed behaviour is tested there)."""
    config = ServerConfig(
        router_endpoint="http://127.0.0.1:1", node_id="n-7", node_labels=["pool=big"]
    )
    state = create_app(config).state
    assert describe_offers(state) == {"pool": "big", "gpu": "cpu", "gpus": "0", "node": "n-7"}
    assert selector_refusal(state, ["node=n-7,pool=big,gpu=cpu"]) is None
    assert selector_refusal(state, []) is None and selector_refusal(state, [" "]) is None
    unfit = selector_refusal(state, ["pool=small"])
    assert unfit is not None and (unfit.status, unfit.kind) == (503, "no_matching_node")
    assert unfit.message.endswith("it offers gpu=cpu, gpus=0, node=n-7, pool=big")
    in_session = selector_refusal(state, ["pool=small"], in_session=True)
    assert in_session is not None and (in_session.status, in_session.kind) == (
        409,
        "selector_mismatch",
    )
    malformed = selector_refusal(state, ["pool"])
    assert malformed is not None and malformed.kind == "invalid_selector"
    assert "pool" not in logged(malformed).message  # the caller's text is never logged


def test_a_selector_refusal_is_counted_under_its_own_error_kind(server: RunningServer) -> None:
    with kcoral.Client(server.url, token=ALICE) as client:
        refusal(lambda: client.execute(program(), select={"gpu": "h100"}))
        metrics = client.request("GET", "/metrics").data.decode()
    counted = [
        line
        for line in metrics.splitlines()
        if line.startswith("kcoral_requests_total{") and 'status="503"' in line
    ]
    assert any('error_kind="no_matching_node"' in line for line in counted), counted
