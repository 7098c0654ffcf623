"""A router's series labelled by node (EXTENSIONS §13), written at a scrape from line heads
that prometheus-client wrote once per label set.

With 256 busy nodes, prometheus-client collecting and writing every sample at each scrape
held the router's event loop ~125 ms (``benchmarks/router_own_scrape.py``), most of it the
per-node queue-wait histograms (22 lines a node), and no request was routed meanwhile. A
line's head (sample name and labels, as prometheus-client's writer writes them) stays the
same for a label set's life: it is written when the label set first shows, and a scrape
only adds each value, formatted by prometheus-client's ``floatToGoString`` (or
``go_float_text``, the same, where a release lacks that internal). The text is
the library's for the same values (``tests/server/test_node_lines.py``), in a fraction of
the time. The per-node counters and histogram keep their counts here as plain numbers, as
prometheus-client's ``Counter`` and ``Histogram`` count them.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterable, Iterator, Sequence

from prometheus_client import generate_latest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from kcoral_server.metrics.exposition import OneMetric


def go_float_text(number: float) -> str:
    """``number`` as Prometheus's text format writes a sample value, as Go prints a float:
    ``+Inf``, ``-Inf``, ``NaN``, Python's shortest form otherwise, except that Go writes a
    positive number of 7 or more integer digits with an exponent (``1234567.0`` is
    ``1.234567e+06``). prometheus-client's ``floatToGoString`` does the same."""
    if math.isnan(number):
        return "NaN"
    if math.isinf(number):
        return "+Inf" if number > 0 else "-Inf"
    text = repr(float(number))
    integer_digits = text.find(".")  # -1 where Python wrote an exponent itself
    if number > 0 and integer_digits > 6:
        digits = (text[:integer_digits] + text[integer_digits + 1 :]).rstrip("0")
        mantissa = f"{digits[0]}.{digits[1:]}".rstrip(".")
        return f"{mantissa}e+{integer_digits - 1:02d}"
    return text


try:  # the library's own formatter, where it has it: the text is then the library's exactly
    from prometheus_client.utils import floatToGoString as go_float
except ImportError:  # an internal, not its documented API: a release may drop or move it
    go_float = go_float_text

#: one label set's values (in the family's label order) and its samples' values, in order
Row = tuple[tuple[str, ...], Sequence[float]]


class FamilyLines:
    """One family's metric (for prometheus-client) and text (from kept line heads), from
    rows. ``bounds``: a histogram's bucket bounds, ``+Inf`` last; a row's values are then its
    cumulative buckets, its count and its sum."""

    def __init__(
        self,
        name: str,
        documentation: str,
        kind: str,
        labels: Sequence[str],
        bounds: Sequence[float] = (),
    ) -> None:
        self.name, self.documentation, self.kind = name, documentation, kind
        self.labels = list(labels)
        self._bounds = [go_float(bound) for bound in bounds]
        self._heads: dict[tuple[str, ...], list[str]] = {}
        self._header = generate_latest(OneMetric(self.metric(())))

    def metric(self, rows: Iterable[Row]) -> Metric:
        """The family as prometheus-client's metric object."""
        if self.kind == "histogram":
            histogram = HistogramMetricFamily(self.name, self.documentation, labels=self.labels)
            for values, numbers in rows:
                buckets = list(zip(self._bounds, numbers, strict=False))
                histogram.add_metric(list(values), buckets, numbers[-1])
            return histogram
        family_type = CounterMetricFamily if self.kind == "counter" else GaugeMetricFamily
        family = family_type(self.name, self.documentation, labels=self.labels)
        for values, numbers in rows:
            family.add_metric(list(values), numbers[0])
        return family

    def text(self, rows: Iterable[Row]) -> bytes:
        """What prometheus-client writes for ``metric(rows)``. The heads of label sets not
        in ``rows`` are let go, so node ids that come and go leave nothing behind."""
        parts = []
        kept, heads = self._heads, {}
        # Values repeat (a histogram's upper buckets hold its count; gauges are small
        # whole numbers): each is formatted once a scrape.
        written: dict[float | str, str] = {}
        for values, numbers in rows:
            row_heads = kept.get(values)
            if row_heads is None:
                row_heads = self._written_heads(values, numbers)
            heads[values] = row_heads
            for head, number in zip(row_heads, numbers, strict=True):
                key = number or repr(number)  # 0.0 and -0.0 are one dict key, not one text
                text = written.get(key)
                if text is None:
                    text = written[key] = go_float(number) + "\n"
                parts.append(head)
                parts.append(text)
        self._heads = heads
        return self._header + "".join(parts).encode()

    def _written_heads(self, values: tuple[str, ...], numbers: Sequence[float]) -> list[str]:
        """Each sample line's start, name and labels and the space before the value, as
        prometheus-client writes it (a value holds no space)."""
        lines = generate_latest(OneMetric(self.metric([(values, numbers)]))).decode()
        return [
            line.rsplit(" ", 1)[0] + " " for line in lines.splitlines() if not line.startswith("#")
        ]


class NodeCounter(Collector):
    """A counter with one label, counted as ``prometheus_client.Counter`` counts."""

    def __init__(self, name: str, documentation: str, label: str) -> None:
        self.lines = FamilyLines(name, documentation, "counter", [label])
        self._counts: dict[str, float] = {}

    def labels(self, value: str) -> None:
        """Count ``value`` from 0 (written at the next scrape)."""
        self._counts.setdefault(value, 0.0)

    def inc(self, value: str) -> None:
        self._counts[value] = self._counts.get(value, 0.0) + 1.0

    def remove(self, value: str) -> None:
        """Drop ``value``'s series (nothing when it has none)."""
        self._counts.pop(value, None)

    def rows(self) -> list[Row]:
        return [((value,), (count,)) for value, count in self._counts.items()]

    def collect(self) -> Iterator[Metric]:
        yield self.lines.metric(self.rows())

    def text(self) -> bytes:
        return self.lines.text(self.rows())


class NodeHistogram(Collector):
    """A histogram with one label, counted as ``prometheus_client.Histogram`` counts: an
    observation goes in the first bucket whose bound it does not pass."""

    def __init__(self, name: str, documentation: str, label: str, buckets: Sequence[float]) -> None:
        self._bounds = [float(bound) for bound in buckets] + [math.inf]
        self.lines = FamilyLines(name, documentation, "histogram", [label], self._bounds)
        #: each label value's count per bucket (not cumulative), then its sum
        self._counts: dict[str, list[float]] = {}

    def labels(self, value: str) -> None:
        """Count ``value`` from 0 (written at the next scrape)."""
        if value not in self._counts:
            self._counts[value] = [0.0] * (len(self._bounds) + 1)

    def observe(self, value: str, seconds: float) -> None:
        self.labels(value)
        counts = self._counts[value]
        counts[bisect_left(self._bounds, seconds)] += 1.0
        counts[-1] += seconds

    def remove(self, value: str) -> None:
        """Drop ``value``'s series (nothing when it has none)."""
        self._counts.pop(value, None)

    def rows(self) -> list[Row]:
        rows: list[Row] = []
        for value, counts in self._counts.items():
            total, numbers = 0.0, []
            for count in counts[:-1]:
                total += count
                numbers.append(total)
            rows.append(((value,), [*numbers, total, counts[-1]]))
        return rows

    def collect(self) -> Iterator[Metric]:
        yield self.lines.metric(self.rows())

    def text(self) -> bytes:
        return self.lines.text(self.rows())
