"""A real Prometheus (Debian's ``prometheus``) scrapes a real server's and a real router's
``/metrics`` with their metrics token, and one series of each, and one of a node's that came
up its supervisor stream to the router, is read back through Prometheus's HTTP API (issue
33.4). CI installs ``prometheus`` (README
``ci-system-packages``), and this file is in ``tests/ci_required.txt``, so it never skips
there."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from http_helpers import execute
from raw_http import call_program
from server_process import RunningServer, start_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))
from router_helpers import Node, RouterProcess, ready_nodes, start_router

PROMETHEUS = shutil.which("prometheus")
NODE_TOKEN = "n0de-t0ken-for-prometheus"
METRICS_TOKEN = "scraper-t0ken-for-prometheus"
CLIENT_TOKEN = "client-t0ken-for-prometheus"
#: how long Prometheus may take to start and scrape (a generous bound, not a measurement)
PATIENCE_SECONDS = 90.0

pytestmark = pytest.mark.skipif(
    PROMETHEUS is None, reason="prometheus is not installed (apt-get install prometheus)"
)


def free_loopback_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def scrape_config(targets: dict[str, str], token_file: Path) -> str:
    """Prometheus's configuration: one job per ``name -> host:port``, each with the token."""
    jobs = [
        {
            "job_name": name,
            "metrics_path": "/metrics",
            "authorization": {"type": "Bearer", "credentials_file": str(token_file)},
            "static_configs": [{"targets": [target]}],
        }
        for name, target in targets.items()
    ]
    return json.dumps(  # YAML is a superset of JSON
        {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "scrape_configs": jobs,
        }
    )


def query(base: str, expression: str) -> list[dict]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": expression})
    with urllib.request.urlopen(url, timeout=10) as response:
        answer = json.load(response)
    assert answer["status"] == "success", answer
    return list(answer["data"]["result"])


def wait_for_series(base: str, expression: str, process: subprocess.Popen) -> list[dict]:
    deadline = time.monotonic() + PATIENCE_SECONDS
    while True:
        assert process.poll() is None, "prometheus exited"
        try:
            result = query(base, expression)
        except OSError:
            result = []  # not listening yet
        if result or time.monotonic() > deadline:
            return result
        time.sleep(0.5)


def start_prometheus(
    directory: Path, targets: dict[str, str], token_file: Path
) -> tuple[subprocess.Popen, str]:
    """A real Prometheus scraping ``targets`` every second with the token of ``token_file``,
    logging to ``directory/prometheus.log``; the process and its HTTP API's base URL."""
    port = free_loopback_port()
    config = directory / "prometheus.yml"
    config.write_text(scrape_config(targets, token_file))
    assert PROMETHEUS is not None
    with open(directory / "prometheus.log", "wb") as output:
        process = subprocess.Popen(
            [
                PROMETHEUS,
                f"--config.file={config}",
                f"--storage.tsdb.path={directory / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    return process, f"http://127.0.0.1:{port}"


def scraping(
    directory: Path, server: RunningServer, router: RouterProcess
) -> tuple[subprocess.Popen, str]:
    """``start_prometheus`` on jobs ``kcoral-server`` and ``kcoral-router`` with the metrics
    token in a file of its own."""
    scraper_token = directory / "scraper-token"
    scraper_token.write_text(METRICS_TOKEN)
    scraper_token.chmod(0o600)
    targets = {
        "kcoral-server": f"{server.host}:{server.port}",
        "kcoral-router": f"127.0.0.1:{router.port}",
    }
    return start_prometheus(directory, targets, scraper_token)


def stop(prometheus: subprocess.Popen) -> None:
    prometheus.terminate()
    try:
        prometheus.wait(30)
    except subprocess.TimeoutExpired:
        prometheus.kill()
        prometheus.wait()


def test_prometheus_scrapes_a_server_and_a_router_with_the_metrics_token_and_answers_queries(
    tmp_path: Path,
) -> None:
    token_file = tmp_path / "tokens"
    token_file.write_text(CLIENT_TOKEN + "\n")
    token_file.chmod(0o600)
    server = start_server(
        tmp_path / "server",
        ["--num-workers", "1", "--auth-token-file", str(token_file)],
        env={"KCORAL_METRICS_TOKEN": METRICS_TOKEN},
    )
    secrets = {"KCORAL_NODE_TOKEN": NODE_TOKEN, "KCORAL_METRICS_TOKEN": METRICS_TOKEN}
    router = start_router(tmp_path, "--auth-token-file", str(token_file), env=secrets)
    # The node's own text goes up at its first healthy probe, then not again during the test
    # (600 s): it holds its gauges but no request count, so the kcoral_requests_total query
    # below finds the server's series only.
    node = Node(
        tmp_path,
        router,
        "node-p",
        {"KCORAL_NODE_TOKEN": NODE_TOKEN},
        "--metrics-interval-seconds",
        "600",
    )
    prometheus, base = scraping(tmp_path, server, router)
    log = tmp_path / "prometheus.log"
    try:
        headers = {"Authorization": f"Bearer {CLIENT_TOKEN}"}
        program = call_program("def main():\n    return 1\n")
        assert execute(server.url, program, headers=headers).status == 200
        ready_nodes(router, 1)
        assert execute(router.url, program, headers=headers).status == 200
        series = 'kcoral_requests_total{reason="completed",status="200"}'
        found = wait_for_series(base, series, prometheus)
        assert found, log.read_text(errors="replace")[-3000:]
        assert found[0]["metric"]["job"] == "kcoral-server"
        assert float(found[0]["value"][1]) >= 1
        routed = wait_for_series(
            base, 'kcoral_router_routed_requests_total{node="node-p"} > 0', prometheus
        )
        assert routed and routed[0]["metric"]["job"] == "kcoral-router"
        assert float(routed[0]["value"][1]) >= 1
        # A node's own series, up its supervisor stream, labelled by the router (§13).
        relayed = wait_for_series(
            base, 'kcoral_request_capacity{job="kcoral-router",node="node-p"}', prometheus
        )
        assert relayed and relayed[0]["metric"]["kind"] == "cpu"
        for job in (
            "kcoral-server",
            "kcoral-router",
        ):  # each scrape itself succeeded, token and all
            up = query(base, f'up{{job="{job}"}}')
            assert up and up[0]["value"][1] == "1", job
    finally:
        stop(prometheus)
        node.stop()
        router.stop()
        server.stop()


def test_a_first_retirement_and_a_nodes_first_routed_request_show_in_prometheus_increase(
    tmp_path: Path,
) -> None:
    """A counter's series that first appeared at 1 had no increase to Prometheus: ``rate`` and
    ``increase`` need an earlier sample, so a GPU's first crash retirement or a node's first
    routed request (or tunnel error) never showed in a rate or a dashboard. Their label sets
    are known (configured GPUs x reasons; each known node and kind) and are written at 0
    from the start; here Prometheus has scraped them before the first one counts."""
    token_file = tmp_path / "tokens"
    token_file.write_text(CLIENT_TOKEN + "\n")
    token_file.chmod(0o600)
    server = start_server(
        tmp_path / "server",
        [
            *("--num-workers", "1", "--max-requests-per-worker", "1"),
            *("--auth-token-file", str(token_file)),
        ],
        env={"KCORAL_METRICS_TOKEN": METRICS_TOKEN},
    )
    secrets = {"KCORAL_NODE_TOKEN": NODE_TOKEN, "KCORAL_METRICS_TOKEN": METRICS_TOKEN}
    router = start_router(tmp_path, "--auth-token-file", str(token_file), env=secrets)
    node_env = {"KCORAL_NODE_TOKEN": NODE_TOKEN}
    node = Node(tmp_path, router, "node-q", node_env, "--metrics-interval-seconds", "600")
    prometheus, base = scraping(tmp_path, server, router)
    try:
        ready_nodes(router, 1)
        # Scraped once before anything counts: the server serving, the node ready.
        for before in (
            'kcoral_request_capacity{job="kcoral-server"} > 0',
            'kcoral_router_node_state{node="node-q",state="ready"} > 0',
        ):
            assert wait_for_series(base, before, prometheus), before
        headers = {"Authorization": f"Bearer {CLIENT_TOKEN}"}
        program = call_program("def main():\n    return 1\n")
        assert execute(server.url, program, headers=headers).status == 200  # its worker retires
        assert execute(router.url, program, headers=headers).status == 200
        retired = wait_for_series(
            base,
            'increase(kcoral_worker_retirements_total{job="kcoral-server",reason="request_limit"}'
            "[1m]) > 0",
            prometheus,
        )
        assert retired, query(base, 'kcoral_worker_retirements_total{job="kcoral-server"}')
        routed = wait_for_series(
            base, 'increase(kcoral_router_routed_requests_total{node="node-q"}[1m]) > 0', prometheus
        )
        assert routed, query(base, "kcoral_router_routed_requests_total")
        kind_routed = wait_for_series(
            base,
            'increase(kcoral_router_kind_routed_requests_total{kind="cpu"}[1m]) > 0',
            prometheus,
        )
        assert kind_routed, query(base, "kcoral_router_kind_routed_requests_total")
    finally:
        stop(prometheus)
        node.stop()
        router.stop()
        server.stop()
