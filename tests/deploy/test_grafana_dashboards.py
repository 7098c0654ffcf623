"""The Grafana dashboards of ``deploy/grafana/`` query only metrics that exist: every
``kcoral_*`` name in their queries is one a real server's (or router's) ``/metrics`` names."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
from deploy_files import DEPLOY

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))
from metrics_support import exported_names
from router_helpers import start_router
from server_process import start_server

GRAFANA = DEPLOY / "grafana"


def queried_metrics(dashboard: str) -> set[str]:
    document = json.loads((GRAFANA / dashboard).read_text(encoding="utf-8"))
    return {
        name
        for panel in document["panels"]
        for target in panel["targets"]
        for name in re.findall(r"\bkcoral_[a-z_]+", target["expr"])
    }


def test_every_metric_the_server_dashboard_queries_exists(tmp_path: Path) -> None:
    queried = queried_metrics("kcoral-server.json")
    assert len(queried) >= 10
    # a GPU server's (the fake-GPU runtime's): it exports the per-GPU series a CPU one lacks
    fake_gpu = ["--device", "fake-gpu", "--fake-gpu-count", "1", "--workers-per-gpu", "1"]
    server = start_server(tmp_path, fake_gpu)
    try:
        exported = exported_names(server.url)
    finally:
        server.stop()
    assert queried <= exported, queried - exported


def test_every_metric_the_router_dashboard_queries_exists(tmp_path: Path) -> None:
    queried = queried_metrics("kcoral-router.json")
    assert len(queried) >= 8
    router = start_router(tmp_path)
    try:
        exported = exported_names(router.url)
    finally:
        router.stop()
    assert queried <= exported, queried - exported


@pytest.mark.parametrize("dashboard", ["kcoral-server.json", "kcoral-router.json"])
def test_a_dashboard_asks_for_its_prometheus_data_source(dashboard: str) -> None:
    document = json.loads((GRAFANA / dashboard).read_text(encoding="utf-8"))
    variables = {v["name"]: v for v in document["templating"]["list"]}
    assert variables["datasource"]["query"] == "prometheus"
    for panel in document["panels"]:
        assert panel["datasource"]["uid"] == "${datasource}"


def unit_of(expr: str) -> str:
    """The Grafana unit a query's values are in, read off the query: a quantile of a
    ``_seconds`` histogram is seconds, a ``rate`` is per second (bytes, requests -- a tunnel
    error is a failed request -- or other events), an ``increase`` a count, a ``_bytes``
    gauge bytes, any other gauge a count; the ``rate`` of a ``_seconds_total`` counter is a
    share of the time."""
    if expr.startswith("histogram_quantile(") and "_seconds_bucket" in expr:
        return "s"
    if "rate(" in expr:
        if "_seconds_total" in expr:  # seconds per second: a share of the time
            return "percentunit"
        if "_bytes_total" in expr:
            return "Bps"
        return "reqps" if re.search(r"(requests|tunnel_errors)_total", expr) else "ops"
    if re.fullmatch(r"kcoral_[a-z_]*_bytes(\{.*\})?", expr):
        return "bytes"
    return "short"


def shown_unit(panel: dict, ref_id: str) -> str:
    """The unit Grafana shows a panel's query in: an override for its refId, else the
    panel's default."""
    config = panel["fieldConfig"]
    for override in config.get("overrides", []):
        matcher = override["matcher"]
        if matcher == {"id": "byFrameRefID", "options": ref_id}:
            for item in override["properties"]:
                if item["id"] == "unit":
                    return str(item["value"])
    return str(config["defaults"]["unit"])


@pytest.mark.parametrize("dashboard", ["kcoral-server.json", "kcoral-router.json"])
def test_every_dashboard_query_is_shown_in_the_unit_of_what_it_measures(dashboard: str) -> None:
    document = json.loads((GRAFANA / dashboard).read_text(encoding="utf-8"))
    wrong = [
        f"{panel['title']} {target['refId']}: {shown_unit(panel, target['refId'])}, "
        f"not {unit_of(target['expr'])}"
        for panel in document["panels"]
        for target in panel["targets"]
        if shown_unit(panel, target["refId"]) != unit_of(target["expr"])
    ]
    assert not wrong, wrong


def test_the_routers_load_beside_its_capacity_says_whose_each_is() -> None:
    """``kcoral_router_kind_busy`` counts busy workers on nodes of every kind, and
    ``kcoral_router_request_capacity`` only the default kind's slots (as ``/health``): a
    mixed fleet's panel showed 4 in progress of a capacity of 2, an overload that was not
    there. Every series of such a panel now says which nodes it counts."""
    document = json.loads((GRAFANA / "kcoral-router.json").read_text(encoding="utf-8"))
    scope = {
        "kcoral_router_kind_busy": "all kinds",
        "kcoral_router_request_capacity": "default kind",
    }
    for panel in document["panels"]:
        exprs = " ".join(target["expr"] for target in panel["targets"])
        if not all(name in exprs for name in scope):
            continue
        for target in panel["targets"]:
            expected = next((s for name, s in scope.items() if name in target["expr"]), None)
            expected = expected or "all kinds"
            assert expected in target.get("legendFormat", ""), (panel["title"], target)


def test_the_routers_load_counts_the_workers_running_jobs() -> None:
    """A job gives its router slot back with its ``202`` and runs on its worker until it ends,
    so ``kcoral_router_requests_in_progress`` reads 0 through it: the router dashboard's 'Load
    on nodes' read 0 beside 1 worker while that one worker ran a job (``kcoral run``'s way;
    metrics soak, real Prometheus). A panel that sets load beside workers or capacity plots
    the busy gauges, which count jobs (bab3d11)."""
    document = json.loads((GRAFANA / "kcoral-router.json").read_text(encoding="utf-8"))
    beside = ("kcoral_router_kind_workers", "kcoral_router_node_workers", "capacity")
    for panel in document["panels"]:
        exprs = " ".join(target["expr"] for target in panel["targets"])
        if any(name in exprs for name in beside):
            assert "kcoral_router_requests_in_progress" not in exprs, panel["title"]
            assert "_busy" in exprs, panel["title"]


#: the labels that tell one GPU from another: ``gpu`` is a server's own id for it (every
#: server's first GPU is ``0``), ``instance`` the server Prometheus scraped, ``node`` the node
#: behind a router (whose series all come from the router's ``instance``)
ONE_GPU = {"instance", "node", "gpu"}


@pytest.mark.parametrize("dashboard", ["kcoral-server.json", "kcoral-router.json"])
def test_a_query_by_gpu_keeps_each_servers_gpus_apart(dashboard: str) -> None:
    """Summed ``by (gpu)`` alone, GPU 0 of two servers was one series: two servers' GPUs,
    each busy the whole time, read as one GPU busy 200% of the time in the server
    dashboard's busy share (metrics soak, a real Prometheus scraping two fake-GPU servers),
    and their lease waits were one quantile."""
    document = json.loads((GRAFANA / dashboard).read_text(encoding="utf-8"))
    merged = [
        f"{panel['title']} {target['refId']}: by ({grouping})"
        for panel in document["panels"]
        for target in panel["targets"]
        for grouping in re.findall(r"\bby \(([^)]*)\)", target["expr"])
        if "gpu" in {label.strip() for label in grouping.split(",")}
        and not ONE_GPU <= {label.strip() for label in grouping.split(",")}
    ]
    assert not merged, merged
