"""Benchmark and comparison results on the client (EXTENSIONS §12.5): ``dict`` subclasses that
render in a notebook and print as a table.

The decoded JSON stays the source of truth: ``BenchmarkResult`` and ``ComparisonResult``
are the very ``dict`` the server sent, with ``_repr_html_`` (a distribution plot above a
table, drawn by ``kcoral_jupyter.bench_display``) and ``format_comparison`` for terminals.
A returned object becomes one when its ``kind`` says so and its shape fits; anything else
stays a plain ``dict``.

Who can reach what: every string and number here came from a server, which may be rogue.
The text table takes only what it can show (numbers as numbers, names as one line), so a
malformed result prints dashes instead of raising.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kcoral.bench.units import time_unit
from kcoral.notebook import html_of
from kcoral.protocol.strict_json import finite_float

BENCHMARK_KIND = "kcoral.benchmark"
COMPARISON_KIND = "kcoral.comparison"
NAME_WIDTH = 40

__all__ = ["BenchmarkResult", "ComparisonResult", "as_bench_result", "format_comparison"]


class BenchmarkResult(dict[str, Any]):
    """What ``kcoral.builtins.benchmark`` returned, as the ``dict`` it is."""

    def _repr_html_(self) -> str | None:
        return html_of(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # a notebook's text/plain is the table, not a thousand samples; repr() stays the dict's
        printer.text(format_comparison(self))


class ComparisonResult(dict[str, Any]):
    """What ``kcoral.builtins.compare`` returned, as the ``dict`` it is."""

    def _repr_html_(self) -> str | None:
        return html_of(self)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        # a notebook's text/plain is the table, not a thousand samples; repr() stays the dict's
        printer.text(format_comparison(self))


def as_bench_result(value: dict[str, Any]) -> dict[str, Any]:
    """``value`` as a ``BenchmarkResult`` or ``ComparisonResult`` when its ``kind`` names one
    and its shape fits, else ``value`` itself."""
    kind = value.get("kind")
    if kind == BENCHMARK_KIND:
        return BenchmarkResult(value)
    if kind == COMPARISON_KIND and isinstance(value.get("candidates"), Mapping):
        return ComparisonResult(value)
    return value


def one_line(text: object, width: int = NAME_WIDTH) -> str:
    """A server-sent name as one printable line of at most ``width`` characters; a longer
    one keeps its start and its end (names of variants often differ only at the end, as
    ``..._stages=3`` and ``..._stages=4``, which a cut end would show alike)."""
    clean = "".join(ch if ch.isprintable() else "?" for ch in str(text))
    if len(clean) <= width:
        return clean
    head = width // 2
    tail = width - 1 - head
    return clean[:head] + "…" + (clean[len(clean) - tail :] if tail else "")


def rows_of(result: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(name, statistics) per candidate; a benchmark is one row named by its label."""
    if result.get("kind") == COMPARISON_KIND:
        candidates = result.get("candidates")
        if not isinstance(candidates, Mapping):
            return []
        return [
            (str(name), entry if isinstance(entry, Mapping) else {})
            for name, entry in candidates.items()
        ]
    label = result.get("label")
    return [(str(label) if isinstance(label, str) else "benchmark", result)]


def table_unit(result: Mapping[str, Any]) -> tuple[str, float]:
    """One unit for the whole table, the largest median's, so rows compare by eye."""
    medians = [finite_float(entry.get("latency_ms_median")) for _, entry in rows_of(result)]
    return time_unit(max((abs(m) for m in medians if m is not None), default=1.0))


def ms(value: object, unit_ms: float = 1.0) -> str:
    """A time given in ms, in a unit of ``unit_ms`` milliseconds, to 4 digits; ``-`` if none."""
    found = finite_float(value)
    if found is None:
        return "-"
    return f"{found / unit_ms:.4g}"


def ratio_number(value: float, least: int = 3) -> str:
    """A ratio in ``least`` (3) significant digits, more (up to 6) where they would show a
    ratio that is not 1 as ``1``: a significant 0.1 % speedup must not read ``1× [1, 1]
    faster``."""
    for digits in range(least, 7):
        text = f"{value:.{digits}g}"
        if value == 1 or float(text) != 1:
            break
    return text


def ratio_text(interval: object) -> str:
    """``1.98× [1.91, 2.05]`` for a speedup or change, ``-`` without one."""
    if not isinstance(interval, Mapping):
        return "-"
    value, low, high = (finite_float(interval.get(k)) for k in ("value", "ci95_low", "ci95_high"))
    if value is None:
        return "-"
    if low is None or high is None:
        return f"{ratio_number(value)}×"
    for least in range(3, 7):
        # as many digits as the interval needs to show its width: a narrow one read
        # '1.11× [1.11, 1.11]', an interval of no width that a reader could not trust
        shown = [ratio_number(v, least) for v in (value, low, high)]
        if low == high or shown[1] != shown[2]:
            break
    return f"{shown[0]}× [{shown[1]}, {shown[2]}]"


def verdict_of(interval: object) -> str:
    if not isinstance(interval, Mapping):
        return ""
    verdict = interval.get("verdict")
    return one_line(verdict, 30) if isinstance(verdict, str) else ""


def change_of(result: Mapping[str, Any], name: str) -> Mapping[str, Any] | None:
    """This candidate's change against the previous run of the same history key."""
    history = result.get("history")
    if not isinstance(history, Mapping):
        return None
    changes = history.get("changes")
    if not isinstance(changes, Mapping):
        return None
    change = changes.get(name)
    return change if isinstance(change, Mapping) else None


def table_rows(result: Mapping[str, Any]) -> list[list[str]]:
    """The table as cells of text, header first (shared by the text and HTML tables)."""
    unit, unit_ms = table_unit(result)
    header = [
        "candidate",
        "status",
        f"median {unit}",
        f"IQR {unit}",
        "noise",
        "speedup [95% CI]",
        "",
    ]
    with_history = isinstance(result.get("history"), Mapping)
    if with_history:
        header += ["vs previous [95% CI]", ""]
    rows = [header]
    for name, entry in rows_of(result):
        status = one_line(entry.get("status", "ok"), 12)
        error = finite_float(entry.get("max_abs_error"))
        if status == "mismatch" and error is not None:
            status += f" (max error {error:.3g})"
        noise = finite_float(entry.get("noise"))
        speedup = entry.get("speedup")
        if isinstance(speedup, Mapping):
            speed = ratio_text(speedup)
        else:
            speed = "baseline" if name == result.get("baseline") else "-"
        row = [
            one_line(name),
            status,
            ms(entry.get("latency_ms_median"), unit_ms),
            ms(entry.get("latency_ms_iqr"), unit_ms),
            "-" if noise is None else f"{noise:.1%}",
            speed,
            verdict_of(speedup),
        ]
        if with_history:
            change = change_of(result, name)
            flag = ""
            if change is not None:
                flag = "REGRESSION" if change.get("regression") is True else verdict_of(change)
            row += [ratio_text(change), flag]
        rows.append(row)
    return rows


def warnings_of(result: Mapping[str, Any]) -> list[str]:
    warnings = result.get("warnings")
    if not isinstance(warnings, list):
        return []
    return [one_line(w, 300) for w in warnings if isinstance(w, str)]


def problems_of(result: Mapping[str, Any]) -> list[str]:
    """``NAME (failed): WHAT IT RAISED`` / ``NAME (mismatch): WHAT DIFFERED`` per candidate
    that was not timed: the table says only its status, and the why must be seen too."""
    found = []
    for name, entry in rows_of(result):
        status, error = entry.get("status"), entry.get("error")
        if isinstance(status, str) and status != "ok" and isinstance(error, str):
            found.append(f"{one_line(name)} ({one_line(status, 12)}): {one_line(error, 300)}")
    return found


def format_comparison(result: Mapping[str, Any]) -> str:
    """A benchmark or comparison result as a text table (for scripts and terminals): median,
    IQR, noise, speedup with its 95 % interval and what it says, status, why a candidate
    failed or mismatched, and the warnings."""
    rows = table_rows(result)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in rows
    ]
    lines.insert(1, "  ".join("-" * width for width in widths).rstrip())
    facts = facts_of(result)
    if facts:
        lines.append(", ".join(facts))
    lines += problems_of(result)
    lines += [f"warning: {w}" for w in warnings_of(result)]
    history = history_line(result)
    if history is not None:
        lines.append(history)
    return "\n".join(lines)


def _count(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def facts_of(result: Mapping[str, Any]) -> list[str]:
    """Clock, seed, how many calls the statistics cover, what stopped the measurement. A
    benchmark's rounds share its calls (``1000 calls in 10 rounds``): ``10 rounds`` alone
    read as ten samples; a comparison's round is one call per candidate."""
    facts = []
    clock = result.get("clock")
    if isinstance(clock, str):
        facts.append(f"clock {one_line(clock, 20)}")
    seed = _count(result.get("seed"))
    if seed is not None:
        facts.append(f"seed {seed}")
    rounds, calls = _count(result.get("rounds")), _count(result.get("sample_count"))
    if rounds is not None and calls is not None and result.get("kind") == BENCHMARK_KIND:
        facts.append(f"{calls} calls in {rounds} rounds")
    elif rounds is not None:
        facts.append(f"{rounds} rounds")
    stopped = result.get("stopped_by")
    if isinstance(stopped, str):
        facts.append(f"stopped by {one_line(stopped, 20)}")
    return facts


def history_line(result: Mapping[str, Any]) -> str | None:
    """``history: FILE, vs the run of TIME`` (or ``, the first run of LABEL here``): which
    run the "vs previous" column compares with, which the table alone does not say."""
    history = result.get("history")
    if not isinstance(history, Mapping) or not isinstance(history.get("file"), str):
        return None
    line = f"history: {one_line(history['file'], 300)}"
    previous = history.get("previous_time")
    key = history.get("key")
    if isinstance(previous, str):
        return f"{line}, vs the run of {one_line(previous, 40)}"
    if isinstance(key, Mapping) and isinstance(key.get("label"), str):
        return f"{line}, the first run of {one_line(key['label'])!r} here"
    return line
