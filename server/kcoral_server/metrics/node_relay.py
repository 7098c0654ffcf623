"""A node's own metrics at its router (EXTENSIONS §13, ROUTER §4): the ``/metrics`` text its
supervisor sends now and then in ``SupervisorStatus.node_metrics``, checked, and exposed in
the router's ``/metrics`` with the router's ``node`` and ``kind`` labels.

A node opens no inbound port, so nothing can scrape it; its supervisor reads the child's
``/metrics`` over loopback with the router secret and sends the text up the stream it already
holds. Whoever holds the node token can play a node, so the router trusts none of the text:

* it passes on only the families a server exports (``SERVER_FAMILIES``: name, type and label
  names must match; other series are dropped), never the router's own ``kcoral_router_*``,
  and writes its own help text;
* it passes on only the label values a server writes (``kcoral_server.metrics.labels``' words,
  GPU ids of at most ``MAX_GPU_ID_DIGITS`` digits, the ``SECONDS_BUCKETS`` bounds): any
  other value is ``other`` (of samples that become one series the first is kept), a bucket
  of another bound is dropped, so new words in every text add no series;
* it drops any ``node`` or ``kind`` label the node sent and sets both itself, from the
  supervisor stream the text came on and the kind the router holds for that node: no node
  speaks for another;
* it bounds everything: ``MAX_NODE_METRICS_BYTES`` of text, ``MAX_NODE_SAMPLES`` samples
  per node, label values of ``MAX_LABEL_VALUE`` characters, ``MAX_RELAYED_SAMPLES`` samples
  for all nodes together, one text per node every ``MIN_RELAY_INTERVAL_SECONDS`` (parsing
  costs the router CPU, so a node sending faster is not read faster), and only nodes the
  router's metrics name (``MAX_NAMED_NODES``). A text that breaks a bound, or that
  prometheus-client's parser refuses, is refused whole: the node's series disappear, the
  node itself keeps serving, and ``kcoral_router_node_metrics_refused_total{node,reason}``
  counts it;
* it shows a node's series only while the node is connected and runs the server instance
  the text came from.

A node's sample lines are written once per text it sends, off the event loop, with its
parse (``parse_and_write``), and a scrape only joins them (``NodeRelay.text``): built at
every scrape, 128 nodes of 2048 samples held the router's loop 2 s, and any client token
opens ``/metrics``, so one holder scraping in a loop stalled every request through it.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, replace
from functools import cache

from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.parser import text_string_to_metric_families

from kcoral_server.metrics.exposition import OneMetric
from kcoral_server.metrics.labels import (
    ERROR_KINDS,
    FINISH_REASONS,
    RETIRE_REASONS,
    START_PHASES,
    gpu_word,
    status_word,
    word_of,
)
from kcoral_server.metrics.node_lines import go_float
from kcoral_server.metrics.server_metrics import (
    ENDPOINTS,
    SECONDS_BUCKETS,
    SERVER_FAMILIES,
    WORKER_RETIREMENTS,
    Family,
)

#: the most text one status may carry (the supervisor sends none larger)
MAX_NODE_METRICS_BYTES = 131072
#: the most samples kept of one node (an 8-GPU server exports about 650, a 16-GPU one 1200)
MAX_NODE_SAMPLES = 2048
#: the most samples kept of all nodes together (256 8-GPU nodes need some 150000): about
#: 60 MB of typical samples, parsed and written as lines (``NodeLines``), about 120 MB of
#: the largest texts nodes can send (measured with tracemalloc; the lines are most of it)
MAX_RELAYED_SAMPLES = 262144
MAX_LABEL_VALUE = 64
MIN_RELAY_INTERVAL_SECONDS = 5.0
#: the labels the router sets on every relayed sample
ROUTER_LABELS = ("node", "kind")
#: why a text was refused (the ``reason`` label)
REFUSAL_REASONS = frozenset({"too_large", "unparsable", "too_many_samples", "router_full"})

_FAMILIES = {family.name: family for family in SERVER_FAMILIES}


def _words(family: Family, label: str) -> Callable[[str], str]:
    """What a relayed value of ``family``'s ``label`` becomes: the server's own word, else
    ``other``. A node's label values were its own to choose: new ones every text, a node
    token holder grew the router's series, and so Prometheus's, without end."""
    if label == "status":
        return status_word
    if label == "gpu":
        return gpu_word
    allowed = {
        "error_kind": ERROR_KINDS,
        "endpoint": ENDPOINTS,
        "phase": START_PHASES,
        "reason": RETIRE_REASONS if family is WORKER_RETIREMENTS else FINISH_REASONS,
    }[label]
    return lambda value: word_of(value, allowed)


#: each family's label words, in its label order (a label without words fails here, at import)
_LABEL_WORDS = {
    family.name: tuple(_words(family, label) for label in family.labels)
    for family in SERVER_FAMILIES
}
#: the bucket bounds a server writes (``SECONDS_BUCKETS``); a bucket of another is dropped
_BOUNDS = frozenset({go_float(bound) for bound in SECONDS_BUCKETS} | {"+Inf"})

#: one sample: its name, its label values in the family's label order (``le`` last), value
Sample = tuple[str, tuple[str, ...], float]


class RelayRefused(Exception):
    """A node's metrics text that the router does not pass on; ``reason`` names why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


#: a node's kept series, family by family
Families = tuple[tuple[Family, tuple[Sample, ...]], ...]


@dataclass(frozen=True)
class NodeLines:
    """A node's sample lines in the exposition format, family by family, under the router's
    labels they were written with."""

    node_label: str
    kind_label: str
    by_family: tuple[tuple[Family, bytes], ...]


@dataclass(frozen=True)
class NodeSeries:
    """What the router keeps of one node's text."""

    server_instance_id: str
    families: Families
    samples: int
    received_at: float
    lines: NodeLines | None = None


def _label_values(family: Family, name: str, labels: dict[str, str]) -> tuple[str, ...] | None:
    """The sample's label values in ``family``'s order, or None when its labels are not the
    family's (the router's own ``node`` and ``kind`` are dropped first)."""
    for key in ROUTER_LABELS:
        labels.pop(key, None)
    expected = family.labels + (("le",) if name.endswith("_bucket") else ())
    if len(labels) != len(expected) or any(key not in labels for key in expected):
        return None
    values = tuple(labels[key] for key in expected)
    if any(len(value) > MAX_LABEL_VALUE for value in values):
        return None
    own = zip(_LABEL_WORDS[family.name], values[: len(family.labels)], strict=True)
    words = tuple(sys.intern(word(value)) for word, value in own)  # they repeat, node to node
    if name.endswith("_bucket"):
        try:
            bound = float(values[-1])
        except ValueError:
            return None
        if math.isnan(bound):
            return None
        # One spelling per bound, as a server writes it: ``1e-1`` beside ``0.1`` split a
        # ``sum by (le)`` of the node's histogram in two.
        le = go_float(bound)
        if le not in _BOUNDS:
            return None
        return (*words, sys.intern(le))
    return words


def parse_node_metrics(blob: bytes) -> Families:
    """The series of a node's metrics text that the router passes on; ``RelayRefused``
    when the text is refused whole."""
    if len(blob) > MAX_NODE_METRICS_BYTES:
        raise RelayRefused("too_large")
    try:
        parsed = list(text_string_to_metric_families(blob.decode("utf-8")))
    except Exception as exc:  # the parser's errors are not one type; a node's text is foreign
        raise RelayRefused("unparsable") from exc
    kept: dict[str, dict[tuple[str, tuple[str, ...]], float]] = {}
    count = 0
    for parsed_family in parsed:
        family = _FAMILIES.get(parsed_family.name)
        if family is None or parsed_family.type != family.type:
            continue  # not a series a server exports (or a newer server's): dropped
        names = {name: name for name in family.sample_names()}  # one string per name
        samples = kept.setdefault(family.name, {})
        for sample in parsed_family.samples:
            name = names.get(sample.name)
            value = sample.value
            if name is None or isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            count += 1  # counted as sent: samples that become one series are still parsed
            if count > MAX_NODE_SAMPLES:
                raise RelayRefused("too_many_samples")
            values = _label_values(family, name, dict(sample.labels))
            if values is None or (name, values) in samples:
                continue  # of samples that become one series (two words for other), the first
            samples[(name, values)] = float(value)
    return tuple(
        (_FAMILIES[name], tuple((key[0], key[1], value) for key, value in samples.items()))
        for name, samples in kept.items()
        if samples
    )


def _metric(family: Family, samples: Iterable[Sample], node_label: str, kind_label: str) -> Metric:
    """``family``'s ``samples`` of one node, under the router's labels."""
    metric = Metric(family.name, family.documentation, family.type)
    for name, values, value in samples:
        keys = family.labels + (("le",) if name.endswith("_bucket") else ())
        labels = dict(zip(keys, values, strict=True))
        labels["node"], labels["kind"] = node_label, kind_label
        metric.add_sample(name, labels, value)
    return metric


@cache
def _header(family: Family) -> bytes:
    """``family``'s ``# HELP`` and ``# TYPE`` lines, as prometheus-client writes them."""
    return generate_latest(OneMetric(Metric(family.name, family.documentation, family.type)))


def write_lines(families: Families, node_label: str, kind_label: str) -> NodeLines:
    """``families``' sample lines, as prometheus-client writes them (without the header)."""
    by_family = []
    for family, samples in families:
        text = generate_latest(OneMetric(_metric(family, samples, node_label, kind_label)))
        by_family.append((family, text[len(_header(family)) :]))
    return NodeLines(node_label, kind_label, tuple(by_family))


def parse_and_write(blob: bytes, node_label: str, kind_label: str) -> tuple[Families, NodeLines]:
    """``parse_node_metrics`` and the lines of what it kept, in one go off the event loop."""
    families = parse_node_metrics(blob)
    return families, write_lines(families, node_label, kind_label)


@dataclass(frozen=True)
class LiveNode:
    """A connected node as the scrape sees it: its id, server instance and label values."""

    node_id: str
    server_instance_id: str
    node_label: str
    kind_label: str


class NodeRelay:
    """The nodes' series the router holds, and their exposition at a scrape."""

    def __init__(self) -> None:
        self._nodes: dict[str, NodeSeries] = {}
        self._parsed_at: dict[str, float] = {}

    def wants(self, node_id: str, now: float) -> bool:
        """Whether a text from ``node_id`` is read now (at most one per interval)."""
        last = self._parsed_at.get(node_id)
        if last is not None and now - last < MIN_RELAY_INTERVAL_SECONDS:
            return False
        self._parsed_at[node_id] = now
        return True

    def keep(
        self,
        node_id: str,
        server_instance_id: str,
        families: Families,
        now: float,
        live: Iterable[str],
        lines: NodeLines | None = None,
    ) -> None:
        """Hold ``families`` (and their ``lines``, when written) as ``node_id``'s series;
        ``RelayRefused("router_full")`` when all nodes' series together would pass
        ``MAX_RELAYED_SAMPLES`` (the series of nodes not in ``live`` are let go first)."""
        connected = set(live)
        for gone in [n for n in self._nodes if n not in connected]:
            self.forget(gone)
        count = sum(len(samples) for _, samples in families)
        others = sum(s.samples for n, s in self._nodes.items() if n != node_id)
        if others + count > MAX_RELAYED_SAMPLES:
            self.refuse(node_id)
            raise RelayRefused("router_full")
        self._nodes[node_id] = NodeSeries(server_instance_id, families, count, now, lines)

    def refuse(self, node_id: str) -> None:
        """Drop ``node_id``'s series after a refused text (its next is still read no sooner
        than an interval after this one)."""
        self._nodes.pop(node_id, None)

    def forget(self, node_id: str) -> None:
        """Drop all the router holds of a node that left."""
        self._nodes.pop(node_id, None)
        self._parsed_at.pop(node_id, None)

    @property
    def samples(self) -> int:
        return sum(series.samples for series in self._nodes.values())

    def _shown(self, live: Iterable[LiveNode]) -> Iterator[tuple[LiveNode, NodeSeries]]:
        """The live nodes' series, where they came from the server instance each runs."""
        for node in live:
            series = self._nodes.get(node.node_id)
            if series is not None and series.server_instance_id == node.server_instance_id:
                yield node, series

    def collect(self, live: Iterable[LiveNode]) -> Iterator[Metric]:
        """One family per name, with every live node's samples under its labels (what
        ``text`` writes, as metric objects)."""
        merged: dict[str, Metric] = {}
        for node, series in self._shown(live):
            for family, samples in series.families:
                metric = _metric(family, samples, node.node_label, node.kind_label)
                if family.name in merged:
                    merged[family.name].samples += metric.samples
                else:
                    merged[family.name] = metric
        yield from merged.values()

    def text(self, live: Iterable[LiveNode]) -> bytes:
        """``collect``'s families in the exposition format, joined from the lines each
        node's text was written as (written here only when a node's labels changed since)."""
        bodies: dict[Family, list[bytes]] = {}
        for node, series in self._shown(live):
            lines = series.lines
            if lines is None or (lines.node_label, lines.kind_label) != (
                node.node_label,
                node.kind_label,
            ):
                lines = write_lines(series.families, node.node_label, node.kind_label)
                self._nodes[node.node_id] = replace(series, lines=lines)
            for family, body in lines.by_family:
                bodies.setdefault(family, []).append(body)
        return b"".join(_header(family) + b"".join(parts) for family, parts in bodies.items())
