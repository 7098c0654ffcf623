"""Every metric EXTENSIONS §13 names is exported, with the labels it names and the type its
name says (``_total`` a counter, ``_seconds`` a histogram, else a gauge), and every metric a
real fake-GPU server and a real router with a fake-GPU node export is named there: an
operator's queries are written from that list."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest
from http_helpers import execute, get
from prometheus_client.parser import text_string_to_metric_families
from raw_http import call_program, post_execute
from server_process import start_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))
from node_metrics_support import matching, wait_for_samples
from router_helpers import Node, ready_nodes, start_router, stopping

pytestmark = pytest.mark.slow

SPEC = Path(__file__).resolve().parents[2] / "docs" / "spec" / "EXTENSIONS.md"
FAKE_GPU = ("--device", "fake-gpu", "--fake-gpu-count", "1", "--workers-per-gpu", "1")
#: the labels a router sets on a node's relayed series
RELAY_LABELS = frozenset({"node", "kind"})


def documented() -> dict[str, set[frozenset[str]]]:
    """Each ``kcoral_*`` name §13 gives -> the label sets it gives it with (``{a,b}``)."""
    text = SPEC.read_text(encoding="utf-8")
    section = text[text.index("## 13. Prometheus") : text.index("## 14. ")]
    named: dict[str, set[frozenset[str]]] = {}
    for match in re.finditer(r"`(kcoral_[a-z_]+)(?:\{([a-z_,]*)\})?`", section):
        labels = match.group(2)
        given = named.setdefault(match.group(1), set())
        if labels is not None:
            given.add(frozenset(labels.split(",")))
    return named


def exported(text: str, relayed: bool = False) -> dict[str, tuple[str, set[frozenset[str]]]]:
    """Each sample family of an exposition -> its type and the label sets of its samples
    (``le`` and, for a node's series a router relays, ``node`` and ``kind`` left out)."""
    families: dict[str, tuple[str, set[frozenset[str]]]] = {}
    for family in text_string_to_metric_families(text):
        name = family.name + ("_total" if family.type == "counter" else "")
        own = relayed and family.name.startswith("kcoral_router_")
        dropped = {"le"} | (RELAY_LABELS if relayed and not own else set())
        sets = {frozenset(sample.labels) - dropped for sample in family.samples}
        families[name] = (family.type, sets)
    return families


def type_by_name(name: str) -> str:
    if name.endswith("_total"):
        return "counter"
    return "histogram" if name.endswith("_seconds") else "gauge"


def test_every_metric_the_spec_names_is_exported_as_named_and_every_exported_one_is_named(
    tmp_path: Path,
) -> None:
    server = start_server(tmp_path / "server", FAKE_GPU)
    try:
        program = call_program("def main():\n    return 1\n")
        assert execute(server.url, program).status == 200
        server_text = get(server.url, "/metrics").raw.decode()
    finally:
        server.stop()
    router = start_router(tmp_path, "--status-check-interval-seconds", "0.3")
    node = Node(tmp_path, router, "gpu-d", None, *FAKE_GPU, "--metrics-interval-seconds", "0.5")
    with stopping(router, [node]):
        ready_nodes(router, 1)
        assert post_execute(router.url, program).status == 200
        wait_for_samples(
            router.url,
            lambda s: matching(s, "kcoral_requests_total", node="gpu-d", reason="completed"),
            "the node's counted program",
        )
        router_text = get(router.url, "/metrics").raw.decode()
    named = documented()
    found = exported(server_text) | exported(router_text, relayed=True)
    assert set(found) == set(named), (set(found) - set(named), set(named) - set(found))
    for name, (kind, label_sets) in found.items():
        assert kind == type_by_name(name), (name, kind)
        given = named[name] or {frozenset()}
        # a family that counted nothing yet has no sample to show its labels
        assert label_sets in (given, set()), (name, label_sets, given)
