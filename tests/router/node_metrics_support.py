"""Reading a router's ``/metrics`` in tests (its samples, found by name and labels), and a
fake node that sends a metrics text of the test's choosing."""

from __future__ import annotations

import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass

from kcoral_server.proto import kcoral_gateway_pb2 as pb
from prometheus_client.parser import text_string_to_metric_families
from router_helpers import FakeNode


@dataclass
class MetricsNode(FakeNode):
    """A fake node whose every status carries ``text`` as its metrics, under kind ``gpu``."""

    text: bytes = b""
    gpu: str = "cpu"
    gpus: int = 1

    def status(self) -> pb.SupervisorStatus:
        status = super().status()
        status.kind.gpu, status.kind.gpus = self.gpu, self.gpus
        status.node_metrics = self.text
        return status


@dataclass(frozen=True)
class Sample:
    name: str
    labels: dict[str, str]
    value: float


def router_samples(url: str, token: str | None = None) -> list[Sample]:
    """Every sample of the router's ``GET /metrics``."""
    request = urllib.request.Request(url + "/metrics")
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    with urllib.request.urlopen(request, timeout=10) as answer:
        text = answer.read().decode()
    return [
        Sample(sample.name, dict(sample.labels), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    ]


def matching(samples: list[Sample], name: str, **labels: str) -> list[Sample]:
    """The samples named ``name`` whose labels include ``labels``."""
    return [
        s
        for s in samples
        if s.name == name and all(s.labels.get(k) == v for k, v in labels.items())
    ]


def wait_for_samples(
    url: str,
    found: Callable[[list[Sample]], object],
    what: str,
    token: str | None = None,
    timeout: float = 90.0,
) -> list[Sample]:
    """The router's samples once ``found`` is true of them (a bound for slow machines, not a
    measurement)."""
    deadline = time.monotonic() + timeout
    while True:
        samples = router_samples(url, token)
        if found(samples):
            return samples
        assert time.monotonic() < deadline, f"never saw {what}"
        time.sleep(0.2)
