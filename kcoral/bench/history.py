"""Benchmark history (EXTENSIONS §12.6): named results kept in a JSON Lines file beside the
notebook, keyed by label, GPU kind and clock, so a table can show the change against the
previous run of the same key, with its 95 % interval, and flag a significant regression.

The file is the user's: plain JSON, one result per line, a capped set of samples each,
safe to delete. Lines this module cannot read are skipped, never fatal. The statistics
(numpy) are imported only when a labelled result is recorded.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from kcoral.bench.history_file import append, ends_a_line, lines_from_end, open_history

HISTORY_FILE = "kcoral-benchmarks.jsonl"
#: Samples kept per candidate and run: enough for a bootstrap interval, small on disk.
HISTORY_SAMPLES = 200
#: The bootstrap seed of history changes: the same two runs always give the same interval.
CHANGE_SEED = 0
BESIDE_NOTEBOOK = "beside the notebook"
IN_WORKING_DIRECTORY = "in the kernel's working directory: no notebook path is known"


def history_directory(user_ns: Mapping[str, Any] | None = None) -> tuple[Path, str]:
    """Where the history goes and how that was decided.

    Jupyter gives the kernel its notebook's path in ``JPY_SESSION_NAME`` (absolute, or
    relative to the server's root while the kernel runs in the notebook's folder); VS Code
    puts it in ``__vsc_ipynb_file__``. Without either, the working directory, said so."""
    candidates = []
    vscode = (user_ns or {}).get("__vsc_ipynb_file__")
    if isinstance(vscode, str) and vscode:
        candidates.append(Path(vscode))
    session = os.environ.get("JPY_SESSION_NAME", "")
    if session:
        path = Path(session)
        candidates.append(path if path.is_absolute() else Path.cwd() / path.name)
    for notebook in candidates:
        if notebook.suffix == ".ipynb" and notebook.is_file():
            return notebook.parent.resolve(), BESIDE_NOTEBOOK
    return Path.cwd().resolve(), IN_WORKING_DIRECTORY


#: The key's GPU when neither NVML nor torch named it: such runs are recorded, never compared.
UNKNOWN_GPU = "unknown GPU"


def history_key(result: Mapping[str, Any], label: str) -> dict[str, str]:
    """label, GPU kind (NVML's name, else the name torch reported, ``cpu`` on a CPU worker,
    else ``unknown GPU``) and clock of ``result``."""
    gpu = UNKNOWN_GPU
    state = result.get("gpu_state")
    if isinstance(state, Mapping) and isinstance(state.get("name"), str) and state["name"]:
        gpu = state["name"]
    elif isinstance(state, Mapping) and isinstance(state.get("device_name"), str):
        gpu = state["device_name"] or UNKNOWN_GPU
    elif result.get("clock") == "cpu":
        gpu = "cpu"
    clock = result.get("clock")
    return {"label": label, "gpu": gpu, "clock": clock if isinstance(clock, str) else "unknown"}


def _clean(samples: object) -> list[float]:
    """The finite, non-negative numbers of a sample list (anything else: none)."""
    from kcoral.protocol.strict_json import finite_float

    if not isinstance(samples, list):
        return []
    values = (finite_float(s) if isinstance(s, (int, float)) else None for s in samples)
    return [v for v in values if v is not None and v >= 0]


def _candidates(result: Mapping[str, Any]) -> dict[str, list[float]]:
    """name -> samples of each timed candidate (a benchmark is one candidate, its label)."""
    from kcoral.bench.results import rows_of

    found = {}
    for name, entry in rows_of(result):
        values = _clean(entry.get("samples_ms"))
        if values:
            found[name] = values
    return found


def _medians(result: Mapping[str, Any], current: Mapping[str, list[float]]) -> dict[str, float]:
    """name -> the median a line records: the result's own (it covers every call, where
    ``samples_ms`` may be thinned), else the median of the samples."""
    from statistics import median

    from kcoral.bench.results import rows_of
    from kcoral.protocol.strict_json import finite_float

    stated = {name: finite_float(entry.get("latency_ms_median")) for name, entry in rows_of(result)}
    found = {}
    for name, samples in current.items():
        own = stated.get(name)
        found[name] = own if own is not None and own >= 0 else float(median(samples))
    return found


def _versions(result: Mapping[str, Any]) -> dict[str, str]:
    """The driver, CUDA and torch versions a result carries (only those it names)."""
    versions = result.get("versions")
    if not isinstance(versions, Mapping):
        return {}
    return {k: v for k, v in versions.items() if k in _VERSION_KEYS and isinstance(v, str)}


_VERSION_KEYS = ("driver", "cuda", "torch")


def _previous(fd: int, key: Mapping[str, str]) -> dict[str, Any] | None:
    """The last line of ``key`` in the history behind ``fd``, read from the end."""
    for raw in lines_from_end(fd):
        # bytes that are not UTF-8 (a damaged or hand-edited file) spoil only their own line
        try:
            entry = json.loads(raw.decode("utf-8", errors="replace"))
        except ValueError:
            continue  # a hand-edited or cut line: skipped
        if isinstance(entry, dict) and entry.get("key") == dict(key):
            return entry
    return None


def remember(
    result: dict[str, Any], label: str, directory: Path | None = None, where: str = ""
) -> dict[str, Any]:
    """Compare ``result`` with the previous run of its key, append it to the history, and
    put ``history`` into ``result`` (file, key, previous run's time, changes per candidate:
    new median / old median with a bootstrap interval, ``regression`` when the whole
    interval lies above 1.05 (``run_to_run``), and the warnings, which join the result's
    ``warnings``).

    Nothing is compared for an unknown GPU kind (every GPU would share its key), and a
    candidate with fewer than ``MIN_INTERVAL_SAMPLES`` samples on a side is no regression.
    The previous line's samples are cleaned like the new ones; a line without usable
    samples compares nothing and never raises. The file must be the user's own plain file
    (``history_file``): a link, a FIFO or another user's file raises ``OSError``."""
    if directory is None:
        directory, where = history_directory()
    path = directory / HISTORY_FILE
    key = history_key(result, label)
    current = _candidates(result)
    fd = open_history(path)  # the user's own plain file, or OSError saying why not
    try:
        _remember_in(fd, result, key, current, path, where)
    finally:
        os.close(fd)
    return result


def _remember_in(
    fd: int,
    result: dict[str, Any],
    key: dict[str, str],
    current: dict[str, list[float]],
    path: Path,
    where: str,
) -> None:
    from kcoral.bench.run_to_run import run_to_run_change, setup_of, setup_warnings
    from kcoral.bench.stats import thinned, too_few_samples
    from kcoral.protocol.strict_json import finite_float

    previous = _previous(fd, key)
    medians = _medians(result, current)
    warnings: list[str] = []
    changes = {}
    old_candidates = previous.get("candidates") if previous is not None else None
    if key["gpu"] == UNKNOWN_GPU:
        warnings.append(
            "history: the GPU kind is unknown (no NVML name: pip install 'kcoral[gpu]'), so "
            "this run is recorded but compared with nothing (GPUs of every kind would share "
            "its key)"
        )
    elif isinstance(old_candidates, dict):
        for name, samples in current.items():
            old = old_candidates.get(name)
            old_samples = _clean(old.get("samples_ms") if isinstance(old, dict) else None)
            if not old_samples:
                continue
            stated = old.get("latency_ms_median") if isinstance(old, dict) else None
            old_median = finite_float(stated)
            changes[name] = run_to_run_change(
                samples, old_samples, medians[name], old_median, CHANGE_SEED
            )
            why = too_few_samples(samples, old_samples)
            if why is not None:
                warnings.append(f"history: the change of {name!r} (new, previous): {why}")
    versions = _versions(result)
    if previous is not None:
        before = _versions(previous)
        for name in _VERSION_KEYS:
            if name in versions and name in before and versions[name] != before[name]:
                warnings.append(
                    f"history: {name} {versions[name]} differs from the previous run's "
                    f"{before[name]}, so a change may come from it"
                )
    setup = setup_of(result)
    if previous is not None:
        warnings += setup_warnings(setup, previous.get("setup"))
    entry = {
        "key": key,
        "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "kind": result.get("kind"),
        "candidates": {
            name: {
                "latency_ms_median": medians[name],
                "samples_ms": thinned(samples, HISTORY_SAMPLES)[0],
            }
            for name, samples in current.items()
        },
    }
    if versions:
        entry["versions"] = versions
    if setup:
        entry["setup"] = setup
    start = "" if ends_a_line(fd) else "\n"
    append(fd, (start + json.dumps(entry) + "\n").encode("utf-8"))
    previous_time = previous.get("time") if previous is not None else None
    result["history"] = {
        "file": str(path),
        "where": where,
        "key": key,
        "previous_time": previous_time if isinstance(previous_time, str) else None,
        "changes": changes,
        "warnings": warnings,
    }
    if warnings:
        if not isinstance(result.get("warnings"), list):
            result["warnings"] = []
        result["warnings"].extend(warnings)


def remember_benchmarks(
    label: str | None, values: Sequence[Any], user_ns: Mapping[str, Any]
) -> list[str]:
    """What the ``%%kcoral`` magic does after a cell: every benchmark or comparison result
    among ``values`` that has a label (``--bench-label`` first, else its own ``label``) is
    remembered; returns one note per file written, for the cell's output. A label that
    several different results of the cell share records none of them (the note says why)."""
    from kcoral.bench.config import LABEL_LIMIT, truncate_message
    from kcoral.bench.results import BENCHMARK_KIND, BenchmarkResult, ComparisonResult

    if label is not None and not 0 < len(label) <= LABEL_LIMIT:
        # as config 'label': an empty one recorded nothing without a word, a long one
        # became every line's key and the row's name, and filled the output with itself
        return [
            f"kcoral: benchmark {truncate_message(repr(label), 80)} not recorded: "
            f"--bench-label must be 1 to {LABEL_LIMIT} characters, as config 'label' "
            f"(this one has {len(label)})"
        ]
    # the cell's value and an -o name may be the same result decoded twice: one record
    groups: list[list[dict[str, Any]]] = []
    for value in values:
        if not isinstance(value, (BenchmarkResult, ComparisonResult)):
            continue
        for group in groups:
            if group[0] is value or group[0] == value:
                group.append(value)
                break
        else:
            groups.append([value])
    if label and not groups:
        # asked to record, nothing to record: silence would read as "recorded"
        return [
            f"kcoral: benchmark {label!r} not recorded: neither the cell's value nor an -o "
            "name holds a benchmark or comparison result"
        ]
    named = []
    notes = []
    for group in groups:
        own = group[0].get("label")
        name = label or (own if isinstance(own, str) and own else None)
        if name is not None and len(name) > LABEL_LIMIT:
            # a server checks config 'label'; a rogue one's label would be every line's key
            notes.append(
                f"kcoral: benchmark {truncate_message(repr(name), 80)} not recorded: the "
                f"result's label has {len(name)} characters, more than {LABEL_LIMIT}"
            )
        elif name is not None:
            named.append((name, group))
    # different results of one cell under one label would be compared with each other (a
    # fast and a slow kernel read as a regression): none of them is recorded under it
    counts = Counter(name for name, _ in named)
    for name in sorted(n for n, count in counts.items() if count > 1):
        notes.append(
            f"kcoral: benchmark {name!r} not recorded: the cell gave {counts[name]} different "
            "results under this one label, which would be compared with each other; give "
            "each result a label of its own (config 'label', without --bench-label)"
        )
    for name, (first, *same) in named:
        if counts[name] > 1:
            continue
        if first.get("kind") == BENCHMARK_KIND and not first.get("label"):
            # a benchmark is one row named by its label (rows_of): without one it was
            # "benchmark", in the table and in the history, so a later run labelled in its
            # config ('label') was compared with nothing; it takes the name it is kept under
            for result in (first, *same):
                result["label"] = name
        directory, where = history_directory(user_ns)
        try:
            remember(first, name, directory, where)
        except OSError as exc:
            # a folder in the file's place, no permission, a full disk: the cell's result
            # (perhaps minutes of measuring) still comes back, the output says why
            notes.append(
                f"kcoral: benchmark {name!r} not recorded in {directory / HISTORY_FILE}: "
                f"{type(exc).__name__}: {exc.strerror or exc}"
            )
            continue
        for other in same:
            other["history"] = first["history"]
            if "warnings" in first:
                other["warnings"] = first["warnings"]
        notes.append(f"kcoral: benchmark {name!r} recorded in {first['history']['file']} ({where})")
    return notes
