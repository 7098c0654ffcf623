"""Who can read ``/metrics`` (EXTENSIONS §13), attacked on a real server with client tokens
and a metrics token: a web page, a caller without a token, and a scraper's token used to run
a program."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
from http_helpers import execute, get
from metrics_support import scrape, start_server_with_a_metrics_token
from raw_http import call_program

CLIENT_TOKEN = "client-t0ken-for-metrics-tests"
METRICS_TOKEN = "scraper-t0ken-for-metrics-tests"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    directory = tmp_path_factory.mktemp("metrics-access")
    running = start_server_with_a_metrics_token(directory, CLIENT_TOKEN, METRICS_TOKEN)
    yield running
    running.stop()


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def test_a_web_page_gets_403_even_with_the_metrics_token(server) -> None:
    headers = {"Origin": "http://evil.example", **bearer(METRICS_TOKEN)}
    response = get(server.url, "/metrics", headers)
    assert response.status == 403 and b"kcoral_" not in response.raw


def test_no_token_or_a_wrong_one_gets_401(server) -> None:
    for headers in ({}, bearer("not-the-token"), bearer(METRICS_TOKEN + "x")):
        response = get(server.url, "/metrics", headers)
        assert response.status == 401 and b"kcoral_" not in response.raw


def test_the_metrics_token_reads_metrics_but_runs_no_program(server) -> None:
    assert get(server.url, "/metrics", bearer(METRICS_TOKEN)).status == 200
    program = call_program("def main():\n    return 1\n")
    assert execute(server.url, program, headers=bearer(METRICS_TOKEN)).status == 401
    for path in ("/v1/info", "/v1/jobs", "/v1/sessions", "/health"):
        response = get(server.url, path, bearer(METRICS_TOKEN))
        assert response.status in (200, 401)
        if path != "/health":  # /health is public (EXTENSIONS §6)
            assert response.status == 401, path


def test_a_client_token_reads_metrics_where_tokens_are_configured(server) -> None:
    response = get(server.url, "/metrics", bearer(CLIENT_TOKEN))
    assert response.status == 200 and b"kcoral_requests_total" in response.raw


def test_the_metrics_token_never_appears_in_the_server_log(server) -> None:
    get(server.url, "/metrics", bearer(METRICS_TOKEN))
    assert METRICS_TOKEN not in server.stderr()
    assert all(METRICS_TOKEN not in str(record) for record in server.events())


# -- the router's own /metrics ---------------------------------------------------------------

NODE_TOKEN = "n0de-t0ken-for-metrics-tests"


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))
    from router_helpers import Node, ready_nodes, start_router

    directory = tmp_path_factory.mktemp("router-metrics-access")
    token_file = directory / "tokens"
    token_file.write_text(CLIENT_TOKEN + "\n")
    token_file.chmod(0o600)
    secrets = {"KCORAL_NODE_TOKEN": NODE_TOKEN, "KCORAL_METRICS_TOKEN": METRICS_TOKEN}
    running = start_router(directory, "--auth-token-file", str(token_file), env=secrets)
    node = Node(directory, running, "node-m", {"KCORAL_NODE_TOKEN": NODE_TOKEN})
    try:
        ready_nodes(running, 1)
        yield running
    finally:
        node.stop()
        running.stop()


def test_a_web_page_gets_403_from_the_routers_metrics(router) -> None:
    headers = {"Origin": "http://evil.example", **bearer(METRICS_TOKEN)}
    response = get(router.url, "/metrics", headers)
    assert response.status == 403 and b"kcoral_" not in response.raw


def test_no_token_gets_401_from_the_routers_metrics(router) -> None:
    for headers in ({}, bearer(NODE_TOKEN), bearer(METRICS_TOKEN[:-1])):
        response = get(router.url, "/metrics", headers)
        assert response.status == 401 and b"kcoral_" not in response.raw


def test_the_metrics_token_runs_no_program_through_the_router(router) -> None:
    program = call_program("def main():\n    return 1\n")
    assert execute(router.url, program, headers=bearer(METRICS_TOKEN)).status == 401
    for path in ("/v1/info", "/v1/jobs", "/v1/sessions"):
        assert get(router.url, path, bearer(METRICS_TOKEN)).status == 401, path
    assert get(router.url, "/metrics", bearer(METRICS_TOKEN)).status == 200


def test_the_router_counts_a_routed_program_per_node_for_a_client_token(router) -> None:
    program = call_program("def main():\n    return 1\n")
    assert execute(router.url, program, headers=bearer(CLIENT_TOKEN)).status == 200
    text = get(router.url, "/metrics", bearer(CLIENT_TOKEN)).raw.decode()
    # counted, not just there: a known node's count is there at 0 from its start
    routed = scrape(router.url, bearer(CLIENT_TOKEN))
    assert routed['kcoral_router_routed_requests_total{node="node-m"}'] >= 1
    assert 'kcoral_router_node_state{node="node-m",state="ready"} 1.0' in text
    assert 'kcoral_router_requests_total{reason="completed",status="200"}' in text
    router.lines_after_mark()  # every answered request's line is in
    assert METRICS_TOKEN not in router.log() and CLIENT_TOKEN not in router.log()


def test_a_program_never_sees_the_metrics_token_in_its_environment(server) -> None:
    source = "import os\ndef main():\n    return repr(dict(os.environ))\n"
    answer = execute(server.url, call_program(source), headers=bearer(CLIENT_TOKEN))
    assert answer.status == 200 and answer.body["status"] == "COMPLETED"
    assert "PATH" in answer.raw.decode()  # the environment came back
    assert METRICS_TOKEN not in answer.raw.decode()
