"""The text a ``GET /metrics`` answers with, on a server and on a router alike (EXTENSIONS
§13): prometheus-client's text format less its ``_created`` samples."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector


class _WithoutCreated(Collector):
    """``collector``'s metrics less their ``_created`` samples: prometheus-client writes one
    per counter and histogram label set (when it was first counted), a series more for each
    that nothing here reads and a router drops when relaying a node's. Dropped per registry,
    not with the library's process-wide ``disable_created_metrics``, which would change the
    metrics of any other user of prometheus-client in the process (a Jupyter server's)."""

    def __init__(self, collector: Collector) -> None:
        self._collector = collector

    def collect(self) -> Iterator[Metric]:
        for metric in self._collector.collect():
            kept = Metric(metric.name, metric.documentation, metric.type, metric.unit)
            kept.samples = [s for s in metric.samples if not s.name.endswith("_created")]
            yield kept


class OneMetric(Collector):
    """A collector of one metric, for prometheus-client's writer."""

    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> Iterator[Metric]:
        yield self.metric


def exposition_of(registry: Collector) -> bytes:
    """The text format of ``registry``'s metrics, without ``_created`` samples."""
    return generate_latest(_WithoutCreated(registry))
