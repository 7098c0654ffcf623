"""Where the time of a trivial request goes (``perf.py --profile DIR``).

Three views of the same sequential trivial requests against one reused CPU worker:

* client: cProfile of the calling process, split into build / encode / HTTP / decode;
* server: ``py-spy record --subprocesses`` of the front-end and its worker when ``py-spy``
  is on ``PATH`` (sampling, no code changes), summarized per process;
* event log: per-request phase gaps between ``request_received``, ``request_accepted``,
  ``request_routed`` and ``request_finished`` (millisecond timestamps), plus the
  response's own ``queue_ms``/``elapsed_ms``.

Two scenarios: a worker that never imported torch, and one that did (a tensor went
through it first), since reused-worker teardown cost depends on what the process holds;
each on a server of every configuration ``perf.py`` measured (default flags and
``--sandbox none``), so the sandbox's per-request cost shows beside the bare one.
"""

from __future__ import annotations

import collections
import cProfile
import datetime
import itertools
import json
import pstats
import shutil
import signal
import statistics
import subprocess
import time
from pathlib import Path

import numpy as np
import perf_kcoral as kc

import kcoral

# Client functions whose cumulative time splits a request (cProfile keys are file:function).
_CLIENT_PHASES = {
    "build (Program)": ("perf_kcoral.py", "trivial_program"),
    "encode (negotiation)": ("negotiation.py", "first_attempt"),
    "HTTP (urllib3 request + read)": ("http.py", "request"),
    "decode (response)": ("negotiation.py", "handle_response"),
}
_PY_SPY_RATE = 250
# Frames every sample of a process shares (interpreter entry, CLI, event loop): no signal.
_ENTRY_FRAMES = ("<module> (", "main (", "server_main (", "serve (server/kcoral_server/worker/main")
_EVENTS = ("request_received", "request_accepted", "request_routed", "request_finished")


def profile_trivial(
    directory: Path,
    requests: int,
    configurations: tuple[kc.Configuration, ...] = (kc.SANDBOX_NONE,),
) -> dict:
    """Profile both scenarios on a server of each configuration (issue 31: default flags
    beside ``--sandbox none``, to find what the sandbox adds per request)."""
    directory.mkdir(parents=True, exist_ok=True)
    report: dict = {"requests": requests, "scenarios": {}}
    lines = [f"profile of {requests} sequential trivial requests, 1 reused worker"]
    scenarios = [
        (f"{scenario} ({configuration.name})", with_torch, configuration)
        for configuration in configurations
        for scenario, with_torch in (("plain worker", False), ("worker after a torch tensor", True))
    ]
    for name, with_torch, configuration in scenarios:
        folder = directory / "".join(c if c.isalnum() else "_" for c in name)
        scenario = _scenario(folder, requests, with_torch, configuration)
        report["scenarios"][name] = scenario
        lines += ["", f"== {name}: wall p50 {scenario['wall_p50_ms']:.1f} ms"]
        lines += [f"  client {k}: {v:.2f} ms/request" for k, v in scenario["client"].items()]
        lines += [f"  server {k}: {v:.2f} ms (median)" for k, v in scenario["events"].items()]
        for process, frames in scenario.get("py_spy", {}).items():
            lines.append(f"  py-spy {process}: on-CPU ms/request (inclusive), top frames")
            lines += [f"    {value:7.2f}  {frame}" for frame, value in frames]
    report["summary"] = "\n".join(lines)
    (directory / "summary.txt").write_text(report["summary"] + "\n")
    return report


def _scenario(
    directory: Path, requests: int, with_torch: bool, configuration: kc.Configuration
) -> dict:
    directory.mkdir(parents=True, exist_ok=True)
    logs = directory / "logs"
    extra = ["--num-workers", "1", "--max-requests-per-worker", "0"]
    result: dict = {}
    with (
        kc.kcoral_server(extra, configuration=configuration, log_dir=logs) as server,
        kcoral.Client(server.url) as client,
    ):
        if with_torch:
            client.execute(kc.echo_program("tensor", np.zeros(4, dtype=np.float32)))
        kc.trivial_round_trips(client, 5)
        spy = _start_py_spy(server.pid, directory / "py-spy.txt")
        first_request = time.time()
        profiler = cProfile.Profile()
        profiler.enable()
        walls = kc.trivial_round_trips(client, requests)
        profiler.disable()
        if spy is not None:
            spy.send_signal(signal.SIGINT)
            spy.wait(timeout=60)
            result["py_spy"] = _summarize_py_spy(directory / "py-spy.txt", requests)
        profiler.dump_stats(directory / "client.prof")
    result["wall_p50_ms"] = statistics.median(walls) * 1000
    result["client"] = _client_phases(profiler, requests)
    result["events"] = _event_phases(logs, first_request)
    return result


def _client_phases(profiler: cProfile.Profile, requests: int) -> dict[str, float]:
    stats = pstats.Stats(profiler).stats  # {(file, line, func): (cc, nc, tt, ct, callers)}
    phases = {}
    for label, (file_name, function) in _CLIENT_PHASES.items():
        total = sum(
            value[3]
            for (path, _line, func), value in stats.items()
            if path.endswith(file_name) and func == function
        )
        phases[label] = total * 1000 / requests
    return phases


def _event_phases(logs: Path, since: float) -> dict[str, float]:
    """Median gaps between the four per-request events of requests after ``since``."""
    stamps: dict[str, dict[str, float]] = collections.defaultdict(dict)
    extra: dict[str, list[float]] = collections.defaultdict(list)
    for path in logs.glob("runs/*/events.jsonl"):
        for line in path.read_text().splitlines():
            record = json.loads(line)
            if record.get("event") not in _EVENTS or "request_id" not in record:
                continue
            when = datetime.datetime.fromisoformat(record["timestamp"].replace("Z", "+00:00"))
            stamps[record["request_id"]][record["event"]] = when.timestamp()
            if record["event"] == "request_finished" and when.timestamp() >= since:
                for key in ("queue_ms", "elapsed_ms"):
                    if isinstance(record.get(key), (int, float)):
                        extra[f"response {key}"].append(record[key])
    gaps: dict[str, list[float]] = collections.defaultdict(list)
    for events in stamps.values():
        if len(events) != len(_EVENTS) or events["request_received"] < since:
            continue
        for before, after in itertools.pairwise(_EVENTS):
            gaps[f"{before} -> {after}"].append((events[after] - events[before]) * 1000)
    summary = {k: statistics.median(v) for k, v in gaps.items()}
    summary.update({k: statistics.median(v) for k, v in extra.items()})
    return summary


def _start_py_spy(pid: int, output: Path) -> subprocess.Popen | None:
    if shutil.which("py-spy") is None:
        return None
    command = ["py-spy", "record", "--subprocesses", "--pid", str(pid), "--format", "raw"]
    command += ["--rate", str(_PY_SPY_RATE), "--nonblocking", "--output", str(output)]
    spy = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.5)  # py-spy attaches to the process tree before sampling starts
    return spy


def _in_worker_package(frame: str) -> bool:
    """A frame of the worker process's own package (``kcoral_server.worker``), not of the
    front-end's ``worker_*`` modules (``worker_run``, ``worker_handle``, ...)."""
    marks = ("kcoral_server.worker.", "kcoral_server/worker/", "server/kcoral_server/worker/")
    return any(mark in frame for mark in marks) or frame.endswith("kcoral_server.worker")


def _summarize_py_spy(path: Path, requests: int, top: int = 12) -> dict[str, list]:
    """Top inclusive project frames per process (front-end vs worker), in on-CPU
    milliseconds per request (py-spy leaves idle samples out by default)."""
    if not path.exists():
        return {}
    ms_per_sample = 1000 / _PY_SPY_RATE
    inclusive: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in path.read_text().splitlines():
        stack, _sep, count = line.rpartition(" ")
        frames = stack.split(";")
        worker = next((f for f in frames if _in_worker_package(f)), None)
        process = "worker" if worker else "front-end"
        for frame in set(frames):
            if frame.startswith(_ENTRY_FRAMES):
                continue
            if "server/" in frame or "kcoral/" in frame or "posixpath" in frame:
                inclusive[process][frame] += int(count)
    return {
        process: [(frame, n * ms_per_sample / requests) for frame, n in counter.most_common(top)]
        for process, counter in inclusive.items()
    }
