"""HTML of benchmark and comparison results (EXTENSIONS §12.5): a box plot per candidate
(SVG, drawn here, no plotting library) above the table of ``kcoral.bench.results``.

Who can reach what: a rogue server chooses every candidate name, status, warning and
number. Names and text are escaped into our own markup and into the SVG; the SVG itself is
shown as a data URI inside ``<img>``, where a browser never runs scripts or loads anything,
so even a name that escaped our escaping could not act. Numbers are drawn only when they are
finite, and the plot keeps to a fixed size whatever they are.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from typing import Any

from kcoral.bench.results import (
    facts_of,
    history_line,
    one_line,
    problems_of,
    rows_of,
    table_rows,
    warnings_of,
)
from kcoral.bench.units import duration, time_unit
from kcoral.protocol.strict_json import finite_float

PLOT_WIDTH = 640
ROW_HEIGHT = 34
LABEL_WIDTH = 170
MAX_POINTS = 200
_COLOURS = ("#0969da", "#bc4c00", "#1a7f37", "#8250df", "#cf222e", "#57606a")
_BOX = (
    "font-family:var(--jp-code-font-family,monospace);font-size:12px;"
    "border:1px solid #d0d7de;border-radius:6px;padding:8px;margin:4px 0;max-width:900px"
)
_CELL = "padding:2px 8px;text-align:left;border-bottom:1px solid #eaeef2"


def escape(text: object) -> str:
    return html.escape(str(text), quote=True)


def _quartiles(entry: Mapping[str, Any]) -> tuple[float, ...] | None:
    keys = ("latency_ms_p05", "latency_ms_p25", "latency_ms_median", "latency_ms_p75")
    values = [finite_float(entry.get(key)) for key in (*keys, "latency_ms_p95")]
    if any(v is None for v in values):
        return None
    return tuple(v for v in values if v is not None)


def _points(entry: Mapping[str, Any]) -> list[float]:
    samples = entry.get("samples_ms")
    if not isinstance(samples, list):
        return []
    # evenly over the whole run (not its first calls only), so late drift shows too
    step = max(1.0, len(samples) / MAX_POINTS)
    picked = (samples[int(i * step)] for i in range(min(MAX_POINTS, len(samples))))
    return [v for v in (finite_float(s) for s in picked) if v is not None]


def beyond_axis(values: Sequence[float]) -> str:
    """The line counting the samples drawn at the axis's edges, each time in its own unit
    (``20.6 µs to 4.07 ms``: one unit read ``0.0206 to 4.07 ms``); one sample reads ``at its
    edge: 4.48 ms``, not ``at its edges: 4.48 to 4.48 ms``."""
    if len(values) == 1:
        return f"1 sample beyond the axis, at its edge: {duration(values[0])}"
    return (
        f"{len(values)} samples beyond the axis, at its edges: {duration(min(values))} "
        f"to {duration(max(values))}"
    )


def box_plot_svg(rows: Sequence[tuple[str, Mapping[str, Any]]]) -> str | None:
    """A box plot (p05–p95 whiskers, p25–p75 box, the median) with each kept sample as a dot,
    one row per candidate that has statistics; ``None`` when none has. The axis spans the
    whiskers; dots beyond it sit at its edge, and a line under it counts them."""
    drawn = [(name, q, _points(entry)) for name, entry in rows if (q := _quartiles(entry))]
    if not drawn:
        return None
    # the axis spans the whiskers (p05-p95), not every sample: one call of 4.5 ms among
    # calls of 0.3 ms squeezed every box into a few pixels, and a 10 % difference vanished;
    # the samples beyond it are drawn at its edge and counted below it
    low = min(q[0] for _, q, _ in drawn)
    high = max(q[4] for _, q, _ in drawn)
    if high <= low:
        low, high = low * 0.9, high * 1.1 + 1e-9
    span = high - low
    low, high = max(0.0, low - 0.1 * span), high + 0.1 * span
    beyond = [v for _, _, points in drawn for v in points if not low <= v <= high]
    inner = PLOT_WIDTH - LABEL_WIDTH - 20
    # the line counting them has a row of its own: beside the axis's unit it ran into it
    # ('... to 4.48 msms per call')
    height = ROW_HEIGHT * len(drawn) + 52 + (14 if beyond else 0)

    def x(value: float) -> float:
        return LABEL_WIDTH + (min(max(value, low), high) - low) / (high - low) * inner

    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{PLOT_WIDTH}" height="{height}" '
        f'viewBox="0 0 {PLOT_WIDTH} {height}" font-family="monospace" font-size="11">',
        f'<rect width="{PLOT_WIDTH}" height="{height}" fill="white"/>',
    ]
    for row, (name, (p05, p25, median, p75, p95), points) in enumerate(drawn):
        colour = _COLOURS[row % len(_COLOURS)]
        middle = 12 + ROW_HEIGHT * row + ROW_HEIGHT / 2
        parts.append(
            f'<text x="{LABEL_WIDTH - 8}" y="{middle + 4:.1f}" text-anchor="end">'
            f"{escape(one_line(name, 22))}</text>"
        )
        parts.append(
            f'<line x1="{x(p05):.1f}" x2="{x(p95):.1f}" y1="{middle:.1f}" y2="{middle:.1f}" '
            f'stroke="{colour}"/>'
        )
        parts.append(
            f'<rect x="{x(p25):.1f}" y="{middle - 9:.1f}" width="{max(1.0, x(p75) - x(p25)):.1f}" '
            f'height="18" fill="{colour}" fill-opacity="0.25" stroke="{colour}"/>'
        )
        parts.append(
            f'<line x1="{x(median):.1f}" x2="{x(median):.1f}" y1="{middle - 9:.1f}" '
            f'y2="{middle + 9:.1f}" stroke="{colour}" stroke-width="2"/>'
        )
        for index, value in enumerate(points):
            jitter = (index % 7 - 3) * 1.6
            parts.append(
                f'<circle cx="{x(value):.1f}" cy="{middle + jitter:.1f}" r="1.3" '
                f'fill="{colour}" fill-opacity="0.5"/>'
            )
    axis = 12 + ROW_HEIGHT * len(drawn) + 4
    # ticks in the unit the axis's end fills: '0.000175 ... 0.00604 ms per call' had six
    # digits of zeros, and its last tick ran past the picture's edge
    unit, unit_ms = time_unit(high)
    parts.append(
        f'<line x1="{LABEL_WIDTH}" x2="{LABEL_WIDTH + inner}" y1="{axis}" y2="{axis}" '
        'stroke="#57606a"/>'
    )
    for tick in range(5):
        value = low + (high - low) * tick / 4
        parts.append(
            f'<text x="{x(value):.1f}" y="{axis + 14}" text-anchor="middle" fill="#57606a">'
            f"{value / unit_ms:.3g}</text>"
        )
    parts.append(
        f'<text x="{LABEL_WIDTH + inner}" y="{axis + 28}" text-anchor="end" fill="#57606a">'
        f"{unit} per call</text>"
    )
    if beyond:
        parts.append(
            f'<text x="{LABEL_WIDTH}" y="{axis + 42}" fill="#57606a">'
            f"{escape(beyond_axis(beyond))}</text>"
        )
    parts.append("</svg>")
    return "".join(parts)


def _table_html(result: Mapping[str, Any]) -> str:
    rows = table_rows(result)
    head = "".join(f'<th style="{_CELL}">{escape(cell)}</th>' for cell in rows[0])
    body = []
    for row in rows[1:]:
        cells = []
        for cell in row:
            style = _CELL
            if cell.startswith(("mismatch", "failed")) or cell in ("REGRESSION", "slower"):
                style += ";color:#cf222e;font-weight:bold"
            elif cell == "faster":
                style += ";color:#1a7f37"
            cells.append(f'<td style="{style}">{escape(cell)}</td>')
        body.append(f"<tr>{''.join(cells)}</tr>")
    return (
        '<table class="kcoral-bench-table" style="border-collapse:collapse">'
        f"<thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"
    )


def bench_result_html(result: Mapping[str, Any]) -> str:
    """The notebook view of a ``BenchmarkResult`` or ``ComparisonResult``."""
    parts = [f'<div class="kcoral-bench" style="{_BOX}">']
    svg = box_plot_svg(rows_of(result))
    if svg is not None:
        data = base64.b64encode(svg.encode("utf-8")).decode("ascii")
        parts.append(
            f'<img class="kcoral-bench-plot" alt="latency per call, one box per candidate" '
            f'src="data:image/svg+xml;base64,{data}"/>'
        )
    parts.append(_table_html(result))
    facts = facts_of(result)
    if facts:
        parts.append(f'<div style="color:#57606a;margin-top:4px">{escape(", ".join(facts))}</div>')
    for problem in problems_of(result):
        parts.append(f'<div style="color:#cf222e">{escape(problem)}</div>')
    for warning in warnings_of(result):
        parts.append(f'<div style="color:#bc4c00">⚠ {escape(warning)}</div>')
    history = history_line(result)
    if history is not None:
        parts.append(f'<div style="color:#57606a">{escape(history)}</div>')
    parts.append("</div>")
    return "".join(parts)
