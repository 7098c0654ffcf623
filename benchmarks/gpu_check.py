"""GPU truth check: one command that checks what only a real GPU machine can show.

    python benchmarks/gpu_check.py [--json PATH] [--markdown PATH] [--gpus 0,1] [--dry-run]
                                   [--tool-timeout SECONDS]

Starts `kcoral server --device gpu` with 2 workers per GPU (the first GPU only, so that
concurrency checks share one device) and prints a PASS/FAIL/SKIP table, each row with its
pass criterion and the clock its timings came from (`cupti`, `cuda_events`, `cpu`):

* CUDA tensor round trip for every dtype (PASS: all 12 come back bit-identical from CUDA);
* cupti-python in the GPU workers (PASS: installed and the helper used the CUPTI clock;
  FAIL: installed but CUPTI fell back, with the reason; SKIP: not installed);
* two concurrent benchmarks never overlap on the GPU (PASS: disjoint windows and the
  second one waited for the lease);
* a `cpu_only` compile step lets the other request measure meanwhile (PASS: the other
  request's measurement lies inside the compile step);
* an illegal memory access fails only its own request (PASS: `runtime` failure, the next
  request on the GPU works);
* the helper's median for an 8192x8192 bf16 matmul on the server against the same helper in
  this process (PASS: within 3 %), and against plain in-process `torch.cuda.Event` timing
  (PASS: within 3 %);
* `compare` on a 4096x4096 matmul written two ways, `a @ b` and `torch.mm` (PASS: both pass
  the reference check and the speedup is within 3 % of 1: one cuBLAS kernel);
* NVML readings in the helper's result (PASS: the worker's own GPU opened by UUID, with SM
  and memory clocks, temperature and power; FAIL: no `gpu_state` or a reading missing);
* KCoral's overhead per request, elapsed - lease held (PASS: median at most 20 ms);
* `kcoral run` GPU tools (compute-sanitizer, ncu) when installed (PASS: exit 0, output);
* `gpu_count` over all GPUs with NCCL (SKIP with a single GPU; second server).

Every timing row records the device name, driver, clocks and temperature before and after
(NVML when importable, else nvidia-smi). The table is printed as Markdown, ready for the
README (`--markdown PATH` also writes it). `--dry-run` runs every code path it can against a
CPU server (CPU tensors, CPU clock: timings there are fake and labelled so); the verdicts
that need a GPU become SKIP. Exit status: 1 if any row FAILed, 2 if requirements are
missing, else 0.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
TOLERANCE = 0.03
OVERHEAD_LIMIT_MS = 20.0

# module -> what to install; the server needs tornado & co., the check itself the client
_REQUIREMENTS = {
    "kcoral": "the kcoral package: pip install -e . (from the repository root)",
    "numpy": "numpy (pip install numpy)",
    "ml_dtypes": "ml_dtypes (pip install ml_dtypes)",
    "urllib3": "urllib3 (pip install urllib3)",
    "tornado": "the server extra: pip install 'kcoral[server]' (tornado)",
    "cloudpickle": "the server extra: pip install 'kcoral[server]' (cloudpickle)",
    "psutil": "the server extra: pip install 'kcoral[server]' (psutil)",
}
# tvm_ffi and cupti-python (kcoral[gpu]) are optional: the cupti row says whether it is there
_GPU_REQUIREMENTS = {
    "torch": "torch with CUDA (pip install torch)",
}


def missing_requirements(dry_run: bool) -> list[str]:
    wanted = dict(_REQUIREMENTS)
    if not dry_run:
        wanted.update(_GPU_REQUIREMENTS)
    missing = []
    for module, hint in wanted.items():
        try:
            found = importlib.util.find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(f"{module}: {hint}")
    return missing


# ---------------------------------------------------------------------- report rows


@dataclass
class Row:
    name: str
    status: str  # PASS, FAIL or SKIP
    detail: str
    data: dict[str, Any] = field(default_factory=dict)
    environment: dict[str, Any] | None = None  # GPU state before/after, for timing rows
    clock: str | None = None  # where the row's timings came from: cupti, cuda_events, cpu


def gpu_snapshot() -> dict[str, Any]:
    """Device name, driver, clocks and temperature of every GPU (NVML, else nvidia-smi)."""
    taken = time.strftime("%Y-%m-%dT%H:%M:%S")
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        try:
            driver = pynvml.nvmlSystemGetDriverVersion()
            devices = []
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                devices.append(
                    {
                        "index": index,
                        "name": _text(pynvml.nvmlDeviceGetName(handle)),
                        "sm_clock_mhz": pynvml.nvmlDeviceGetClockInfo(handle, pynvml.NVML_CLOCK_SM),
                        "mem_clock_mhz": pynvml.nvmlDeviceGetClockInfo(
                            handle, pynvml.NVML_CLOCK_MEM
                        ),
                        "temperature_c": pynvml.nvmlDeviceGetTemperature(
                            handle, pynvml.NVML_TEMPERATURE_GPU
                        ),
                    }
                )
        finally:
            pynvml.nvmlShutdown()
        return {"source": "nvml", "taken": taken, "driver": _text(driver), "devices": devices}
    except Exception as exc:
        nvml_error = f"{type(exc).__name__}: {exc}"
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return {"source": None, "taken": taken, "error": f"no NVML ({nvml_error}), no nvidia-smi"}
    query = "index,name,driver_version,clocks.sm,clocks.mem,temperature.gpu"
    try:
        out = subprocess.run(
            [smi, f"--query-gpu={query}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        return {"source": "nvidia-smi", "taken": taken, "error": str(exc)}
    devices, driver = [], None
    for line in out.strip().splitlines():
        index, name, driver, sm, mem, temp = (part.strip() for part in line.split(","))
        devices.append(
            {
                "index": int(index),
                "name": name,
                "sm_clock_mhz": sm,
                "mem_clock_mhz": mem,
                "temperature_c": temp,
            }
        )
    return {"source": "nvidia-smi", "taken": taken, "driver": driver, "devices": devices}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# ---------------------------------------------------------------------- server


@contextlib.contextmanager
def server(work: Path, name: str, device_args: list[str]) -> Iterator[str]:
    """A `kcoral server` on a free loopback port; yields its URL, stops it (SIGTERM)."""
    ready = work / f"{name}.url"
    stderr = (work / f"{name}.stderr").open("wb")
    command = [
        sys.executable, "-m", "kcoral", "server", "--port", "0", "--ready-file", str(ready),
        "--sandbox", "none", "--log-dir", str(work / f"{name}-logs"),
        "--disk-cache-dir", str(work / f"{name}-cache"), "--max-requests-per-worker", "0",
        *device_args,
    ]  # fmt: skip
    process = subprocess.Popen(command, stderr=stderr, cwd=ROOT)
    try:
        deadline = time.monotonic() + 180
        while not (ready.exists() and ready.read_text().strip()):
            if process.poll() is not None or time.monotonic() > deadline:
                tail = (work / f"{name}.stderr").read_text(errors="replace")[-3000:]
                raise RuntimeError(f"the {name} server did not start:\n{tail}")
            time.sleep(0.1)
        yield ready.read_text().strip()
    finally:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        stderr.close()


# ---------------------------------------------------------------------- uploaded code

# Runs on the server. `gpu` selects torch on CUDA, otherwise numpy on the CPU (dry run).
WORKLOAD = """
import time

from kcoral.builtins import benchmark, compare

GPU = {gpu}


def matrices(n):
    if GPU:
        import torch
        g = torch.Generator(device="cuda").manual_seed(0)
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=g)
        return a, b
    import numpy as np
    rng = np.random.default_rng(0)
    return rng.random((n, n), dtype=np.float32), rng.random((n, n), dtype=np.float32)


def matmul(a, b):
    return a @ b


def measure(n, config):
    a, b = matrices(n)
    start = time.monotonic()
    report = benchmark(matmul, a, b, config)
    report["window"] = [start, time.monotonic()]
    return report


def mm(a, b):
    if GPU:
        import torch
        return torch.mm(a, b)
    import numpy as np
    return np.dot(a, b)


def compare_matmuls(n, config):
    a, b = matrices(n)
    # the reference is computed here: a callable cannot travel in the JSON config
    checked = dict(config, reference=matmul(a, b), rtol=1e-2, atol=1e-2)
    return compare({{"a @ b": matmul, "torch.mm": mm}}, a, b, checked)


def compile_step(seconds):
    start = time.monotonic()
    time.sleep(seconds)  # stands in for a CPU-only compiler run
    return [start, time.monotonic()]


def describe(*tensors):
    return [str(getattr(t, "device", "cpu")) for t in tensors]


def echo(*tensors):
    return list(tensors)


def small_op(n):
    if GPU:
        import torch
        x = torch.arange(n, device="cuda", dtype=torch.float32)
        return float((x * 2).sum().item())
    return float(sum(2 * i for i in range(n)))


def illegal_access():
    if not GPU:
        import os
        os.abort()  # dry run: a native crash instead of an illegal address
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def poke(pointer):
        tl.store(pointer + (1 << 40), 1.0)

    x = torch.zeros(1, device="cuda")
    poke[(1,)](x)
    torch.cuda.synchronize()
"""


class Check:
    """Shared state of one run: the client, mode and sizes."""

    def __init__(
        self, url: str, dry_run: bool, gpu_ids: list[int], work: Path, tool_timeout: float = 600
    ) -> None:
        import kcoral

        self.kcoral = kcoral
        self.url = url
        self.dry_run = dry_run
        self.gpu = not dry_run
        self.gpu_ids = gpu_ids
        self.work = work
        self.client = kcoral.Client(url)
        self.source = WORKLOAD.format(gpu=self.gpu)
        self.matmul_n = 8192 if self.gpu else 192
        self.bench_n = 4096 if self.gpu else 128
        self.tool_timeout = tool_timeout

    def program(self) -> tuple[Any, Any]:
        program = self.kcoral.Program()
        return program, program.upload(kind="module", source=self.source)

    def measure_program(self, n: int, config: dict[str, Any]) -> Any:
        program, module = self.program()
        measure = program.get_function(module=module, name="measure")
        program.return_(key="report", value=program.run(fn=measure, args=[n, config]))
        return program

    def execute(self, program: Any, **options: Any) -> Any:
        return self.client.execute(program, timeout_seconds=600, **options)


def timed(check: Callable[[Check], Any]) -> Callable[[Check], Any]:
    """Record the GPU state before and after a timing row (or rows)."""

    def wrapper(ctx: Check) -> Any:
        before = gpu_snapshot()
        outcome = check(ctx)
        after = gpu_snapshot()
        for row in outcome if isinstance(outcome, list) else [outcome]:
            row.environment = {"before": before, "after": after}
        return outcome

    wrapper.__name__ = check.__name__
    return wrapper


def _dry(detail: str) -> str:
    return f"dry run (CPU server, fake timings): {detail}"


def _failed(result: Any) -> bool:
    return isinstance(result, Exception) or result.status != "COMPLETED"


def _why(result: Any) -> str:
    return str(getattr(result, "error", None) or result)


# ---------------------------------------------------------------------- the checks


def check_tensor_round_trip(ctx: Check) -> Row:
    import numpy as np

    from kcoral.protocol.dtypes import DTYPES, numpy_dtype

    program, module = ctx.program()
    originals, registers = {}, []
    for dtype in DTYPES:
        base = np.arange(-7, 8, dtype=np.float32).reshape(3, 5)
        if dtype == "bool":
            array = base > 0
        elif dtype.startswith("uint"):
            array = np.abs(base).astype(numpy_dtype(dtype))
        else:
            array = base.astype(numpy_dtype(dtype))
        originals[dtype] = array
        registers.append(program.upload(kind="tensor", value=array))
    describe = program.get_function(module=module, name="describe")
    echo = program.get_function(module=module, name="echo")
    program.return_(key="devices", value=program.run(fn=describe, args=registers))
    program.return_(key="tensors", value=program.run(fn=echo, args=registers))
    result = ctx.execute(program)
    if result.status != "COMPLETED":
        return Row("tensor round trip, every dtype", "FAIL", str(result.error))
    devices = result.results["devices"]
    wrong = []
    for dtype, back, device in zip(DTYPES, result.results["tensors"], devices, strict=True):
        original = originals[dtype]
        same = back.shape == original.shape and back.tobytes() == original.tobytes()
        if not same or (ctx.gpu and not device.startswith("cuda")):
            wrong.append(f"{dtype} (device {device})")
    if wrong:
        return Row("tensor round trip, every dtype", "FAIL", "mismatch: " + ", ".join(wrong))
    detail = f"{len(DTYPES)} dtypes on {sorted(set(devices))}"
    return Row("tensor round trip, every dtype", "PASS", detail, {"devices": devices})


def _concurrently(*calls: Callable[[], Any]) -> list[Any]:
    results: list[Any] = [None] * len(calls)

    def run(i: int) -> None:
        try:
            results[i] = calls[i]()
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
        time.sleep(0.05)
    for t in threads:
        t.join()
    return results


@timed
def check_benchmarks_never_overlap(ctx: Check) -> Row:
    name = "two concurrent benchmarks never overlap"
    config = {"warmup": 5, "repeat": 30}
    program = ctx.measure_program(ctx.bench_n, config)
    first, second = _concurrently(lambda: ctx.execute(program), lambda: ctx.execute(program))
    for result in (first, second):
        if _failed(result):
            return Row(name, "FAIL", f"a request failed: {_why(result)}")
    reports = [first.results["report"], second.results["report"]]
    clock = reports[0]["clock"]
    a, b = reports[0]["window"], reports[1]["window"]
    overlap = a[0] < b[1] and b[0] < a[1]
    data = {
        "windows": [a, b],
        "lease_wait_ms": [first.lease_wait_ms, second.lease_wait_ms],
        "lease_held_ms": [first.lease_held_ms, second.lease_held_ms],
        "median_ms": [r["latency_ms_median"] for r in reports],
        "clock_fallback": reports[0].get("clock_fallback"),
    }
    if ctx.dry_run:
        detail = _dry(f"CPU workers take no lease; overlap={overlap}")
        return Row(name, "SKIP", detail, data, clock=clock)
    waited = max(first.lease_wait_ms, second.lease_wait_ms)
    if overlap or waited <= 0:
        detail = f"overlap={overlap}, max lease_wait_ms={waited:.1f}"
        return Row(name, "FAIL", detail, data, clock=clock)
    detail = f"disjoint windows; one waited {waited:.1f} ms for the lease"
    return Row(name, "PASS", detail, data, clock=clock)


@timed
def check_cpu_only_lets_others_measure(ctx: Check) -> Row:
    name = "cpu_only compile step lets the other request measure"
    seconds = 6.0 if ctx.gpu else 3.0
    compiling, module = ctx.program()
    step = compiling.get_function(module=module, name="compile_step", cpu_only=True)
    compiling.return_(key="window", value=compiling.run(fn=step, args=[seconds]))
    small = compiling.get_function(module=module, name="small_op")
    compiling.return_(key="after", value=compiling.run(fn=small, args=[10]))
    measuring = ctx.measure_program(ctx.bench_n, {"warmup": 3, "repeat": 10})

    def late_measure() -> Any:
        time.sleep(1.5)  # the first request is inside its cpu_only step by then
        return ctx.execute(measuring)

    first, second = _concurrently(lambda: ctx.execute(compiling), late_measure)
    if not isinstance(first, Exception) and first.status == "FAILED":
        if first.error and first.error.get("kind") == "unavailable":
            # no cupti-python in the workers: cpu_only runs are refused (PROTOCOL §6.2)
            return Row(name, "SKIP", f"cpu_only refused: {first.error['message']}")
    for result in (first, second):
        if _failed(result):
            return Row(name, "FAIL", f"a request failed: {_why(result)}")
    clock = second.results["report"]["clock"]
    window = first.results["window"]
    measured = second.results["report"]["window"]
    inside = window[0] <= measured[0] and measured[1] <= window[1]
    data = {"cpu_only_window": window, "measure_window": measured}
    if ctx.dry_run:
        detail = _dry(f"no leases on CPU; measured inside={inside}")
        return Row(name, "SKIP", detail, data, clock=clock)
    if not inside:
        detail = "the measurement did not run during the cpu_only step"
        return Row(name, "FAIL", detail, data, clock=clock)
    detail = "the other request measured while this one compiled"
    return Row(name, "PASS", detail, data, clock=clock)


def check_cupti(ctx: Check) -> Row:
    """Is cupti-python in the GPU workers, and does the helper's CUPTI clock work there?"""
    name = "cupti-python in the GPU workers (CUPTI clock)"
    with ctx.kcoral.Client(ctx.url) as client:
        info = client.info()
    piece = info.get("optional", {}).get("cupti")
    if ctx.dry_run or piece is None:
        return Row(name, "SKIP", _dry("a CPU server has no CUPTI"), {"optional": piece})
    result = ctx.execute(ctx.measure_program(256, {"warmup": 2, "repeat": 5}))
    if _failed(result):
        return Row(name, "FAIL", f"the measurement failed: {_why(result)}")
    report = result.results["report"]
    data = {"optional": piece, "clock_fallback": report.get("clock_fallback")}
    if not piece["available"]:
        detail = f"not installed: {piece['reason']}; timings use {report['clock']}"
        return Row(name, "SKIP", detail, data, clock=report["clock"])
    if report["clock"] != "cupti":
        detail = f"installed, but the helper fell back: {report.get('clock_fallback')}"
        return Row(name, "FAIL", detail, data, clock=report["clock"])
    return Row(name, "PASS", "installed; the helper timed with CUPTI", data, clock="cupti")


def check_illegal_access_is_contained(ctx: Check) -> Row:
    name = "illegal memory access fails only its request"
    if ctx.gpu and importlib.util.find_spec("triton") is None:
        return Row(name, "SKIP", "triton is not installed here (used to make the bad kernel)")
    bad, module = ctx.program()
    crash = bad.get_function(module=module, name="illegal_access")
    bad.run(fn=crash)
    good, module = ctx.program()
    small = good.get_function(module=module, name="small_op")
    good.return_(key="sum", value=good.run(fn=small, args=[100]))
    failed = ctx.execute(bad)
    after = ctx.execute(good)
    data = {"failed": failed.error, "after_status": after.status}
    if failed.status != "FAILED" or failed.error["kind"] != "runtime":
        return Row(name, "FAIL", f"the bad request ended {failed.status}: {failed.error}", data)
    if after.status != "COMPLETED" or after.results["sum"] != 9900.0:
        return Row(name, "FAIL", f"the next request ended {after.status}: {after.error}", data)
    detail = f"bad request: {failed.error['message'][:80]!r}; next request COMPLETED"
    if ctx.dry_run:
        return Row(name, "SKIP", _dry("a worker crash stood in for the illegal address; " + detail))
    return Row(name, "PASS", detail, data)


def _local_measurements(ctx: Check, config: dict[str, Any]) -> dict[str, Any]:
    """The same helper measurement in this process, plus plain CUDA-event timing."""
    from kcoral.builtins import benchmark

    namespace: dict[str, Any] = {}
    exec(compile(WORKLOAD.format(gpu=ctx.gpu), "<gpu_check workload>", "exec"), namespace)
    a, b = namespace["matrices"](ctx.matmul_n)
    helper = benchmark(namespace["matmul"], a, b, config)
    local, clock = helper["latency_ms_median"], helper["clock"]
    if not ctx.gpu:
        start = time.perf_counter_ns()
        for _ in range(10):
            a @ b
        events = (time.perf_counter_ns() - start) / 1e7
        return {"local_helper": local, "local_clock": clock, "events": events}
    import torch

    flush = torch.empty(2 * torch.cuda.get_device_properties(0).L2_cache_size, dtype=torch.uint8,
                        device="cuda")  # fmt: skip
    times = []
    for _ in range(config["repeat"]):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        a @ b
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end))
    return {"local_helper": local, "local_clock": clock, "events": statistics.median(times)}


@timed
def check_matmul_agreement(ctx: Check) -> list[Row]:
    size = f"{ctx.matmul_n}x{ctx.matmul_n} matmul"
    names = (f"{size}: server helper vs local helper (3 %)",
             f"{size}: helper vs in-process CUDA events (3 %)")  # fmt: skip
    config = {"warmup": 10, "repeat": 50}
    result = ctx.execute(ctx.measure_program(ctx.matmul_n, config))
    if _failed(result):
        return [Row(name, "FAIL", f"the server measurement failed: {_why(result)}")
                for name in names]  # fmt: skip
    report = result.results["report"]
    remote = report["latency_ms_median"]
    local = _local_measurements(ctx, config)
    rows = []
    pairs = (
        ("local_helper", f"server {remote:.3f} ms ({report['clock']}) vs local helper "
                         f"{local['local_helper']:.3f} ms ({local['local_clock']})"),
        ("events", f"server helper {remote:.3f} ms ({report['clock']}) vs in-process events "
                   f"{local['events']:.3f} ms"),
    )  # fmt: skip
    for name, (key, detail) in zip(names, pairs, strict=True):
        ratio = remote / local[key] if local[key] else float("inf")
        data = {"server": report, "local": local, "ratio": ratio}
        other = (
            local["local_clock"] if key == "local_helper" else ("cuda_events" if ctx.gpu else "cpu")
        )
        clock = f"{report['clock']} / {other}"
        detail = f"{detail}; ratio {ratio:.3f}"
        if ctx.dry_run:
            rows.append(Row(name, "SKIP", _dry(detail), data, clock=clock))
        else:
            status = "PASS" if abs(ratio - 1) <= TOLERANCE else "FAIL"
            rows.append(Row(name, status, detail, data, clock=clock))
    return rows


COMPARE_TOLERANCE = 0.03  # two spellings of one kernel: the speedup within 3 % of 1


@timed
def check_compare_two_matmuls(ctx: Check) -> Row:
    """``compare`` on a GPU: both variants pass the reference check, and two spellings of one
    cuBLAS kernel (``a @ b``, ``torch.mm``) come out within 3 % of each other."""
    n = ctx.bench_n
    name = f"compare: {n}x{n} matmul, a @ b vs torch.mm (speedup within 3 % of 1)"
    program, module = ctx.program()
    fn = program.get_function(module=module, name="compare_matmuls")
    config = {"warmup": 10, "repeat": 60, "seed": 0}
    program.return_(key="comparison", value=program.run(fn=fn, args=[n, config]))
    result = ctx.execute(program)
    if _failed(result):
        return Row(name, "FAIL", f"the comparison failed: {_why(result)}")
    comparison = result.results["comparison"]
    other = comparison["candidates"]["torch.mm"]
    statuses = {key: entry["status"] for key, entry in comparison["candidates"].items()}
    speedup = other.get("speedup") or {}
    detail = (
        f"statuses {statuses}; speedup {speedup.get('value', float('nan')):.3f} "
        f"[{speedup.get('ci95_low', float('nan')):.3f}, "
        f"{speedup.get('ci95_high', float('nan')):.3f}] over {comparison['rounds']} "
        f"shuffled rounds (seed {comparison['seed']}); warnings {comparison['warnings']}"
    )
    data = {"comparison": comparison}
    if ctx.dry_run:
        return Row(name, "SKIP", _dry(detail), data, clock=comparison["clock"])
    ok = set(statuses.values()) == {"ok"} and abs(speedup["value"] - 1) <= COMPARE_TOLERANCE
    return Row(name, "PASS" if ok else "FAIL", detail, data, clock=comparison["clock"])


def check_nvml_readings(ctx: Check) -> Row:
    """The helper's result carries NVML readings of the worker's own GPU (nvidia-ml-py)."""
    name = "NVML readings with every measurement (clocks, temperature, power, throttling)"
    result = ctx.execute(ctx.measure_program(ctx.bench_n, {"warmup": 5, "repeat": 20}))
    if _failed(result):
        return Row(name, "FAIL", f"the measurement failed: {_why(result)}")
    report = result.results["report"]
    state = report.get("gpu_state")
    if ctx.dry_run:
        detail = f"a CPU worker reports its machine instead: {report.get('machine')}"
        return Row(name, "SKIP", _dry(detail), {"machine": report.get("machine")}, clock="cpu")
    data = {"gpu_state": state, "warnings": report.get("warnings")}
    if not state or not state.get("available"):
        reason = (state or {}).get("reason", "no gpu_state key")
        return Row(name, "FAIL", f"no NVML readings: {reason}", data, clock=report["clock"])
    sample = (state.get("samples") or [{}])[0]
    wanted = ("sm_clock_mhz", "memory_clock_mhz", "temperature_c", "power_w")
    missing = [key for key in wanted if sample.get(key) is None]
    detail = (
        f"{state.get('name')} {state.get('uuid')}: SM {state.get('sm_clock_mhz_min')}–"
        f"{state.get('sm_clock_mhz_max')} MHz, up to {state.get('temperature_c_max')} °C, "
        f"clocks locked {state.get('clocks_locked')}, {state.get('throttled_rounds')} throttled "
        f"rounds; missing {missing or 'nothing'}"
    )
    return Row(name, "FAIL" if missing else "PASS", detail, data, clock=report["clock"])


@timed
def check_overhead(ctx: Check) -> Row:
    name = f"KCoral overhead per request (elapsed - held <= {OVERHEAD_LIMIT_MS:g} ms)"
    program, module = ctx.program()
    small = program.get_function(module=module, name="small_op")
    program.return_(key="sum", value=program.run(fn=small, args=[10]))
    overheads, round_trips = [], []
    for _ in range(20):
        start = time.perf_counter()
        result = ctx.execute(program)
        round_trips.append((time.perf_counter() - start) * 1000)
        if result.status != "COMPLETED":
            return Row(name, "FAIL", f"a request failed: {result.error}")
        overheads.append(result.elapsed_ms - result.lease_held_ms)
    median = statistics.median(overheads)
    data = {"elapsed_minus_held_ms": overheads, "round_trip_ms": round_trips}
    detail = (
        f"median {median:.2f} ms off the GPU (limit {OVERHEAD_LIMIT_MS:g} ms); client round "
        f"trip median {statistics.median(round_trips):.2f} ms"
    )
    clock = "cpu" if ctx.dry_run else "server timings"
    if ctx.dry_run:
        return Row(name, "SKIP", _dry(detail), data, clock=clock)
    status = "PASS" if median <= OVERHEAD_LIMIT_MS else "FAIL"
    return Row(name, status, detail, data, clock=clock)


def check_gpu_count(ctx: Check, all_gpus: list[int]) -> Row:
    name = "gpu_count over all GPUs with NCCL"
    if ctx.dry_run:
        program, module = ctx.program()
        small = program.get_function(module=module, name="small_op")
        program.run(fn=small, args=[1])
        try:
            ctx.execute(program, gpu_count=1)
        except ctx.kcoral.KCoralError as exc:
            return Row(
                name, "SKIP", _dry(f"a CPU server refuses gpu_count: HTTP {exc.status_code}")
            )
        return Row(name, "FAIL", "a CPU server accepted gpu_count")
    if len(all_gpus) < 2:
        return Row(name, "SKIP", f"{len(all_gpus)} GPU: NCCL needs at least 2")
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from nccl_allreduce import build_program
    finally:
        sys.path.pop(0)
    gpus = ",".join(str(g) for g in all_gpus)
    with server(ctx.work, "all-gpus", ["--device", "gpu", "--gpus", gpus,
                                       "--workers-per-gpu", "1"]) as url:  # fmt: skip
        import kcoral

        with kcoral.Client(url) as client:
            result = client.execute(build_program(), gpu_count=len(all_gpus), timeout_seconds=600)
    if result.status != "COMPLETED":
        return Row(name, "FAIL", str(result.error))
    return Row(name, "PASS", f"all-reduce on GPUs {list(result.gpu_ids)}", result.results["report"])


PROBE = "import torch\nx = torch.ones(1024, device='cuda')\nprint(float((x + 1).sum()))\n"


def check_tools(ctx: Check) -> list[Row]:
    rows = []
    probe = ctx.work / "probe.py"
    probe.write_text(PROBE if ctx.gpu else "print(2048.0)\n")
    base = [sys.executable, "-m", "kcoral", "run"]
    if ctx.dry_run:
        command = [*base, "python", "--url", ctx.url, "--send", str(probe), "--", "probe.py"]
        done = subprocess.run(command, capture_output=True, text=True, timeout=300)
        status = "SKIP" if done.returncode == 0 and "2048.0" in done.stdout else "FAIL"
        detail = f"`kcoral run python` exit {done.returncode}; GPU tools need a GPU server"
        return [Row("kcoral run GPU tools", status, _dry(detail))]
    for tool in ("compute-sanitizer", "ncu"):
        name = f"kcoral run {tool} (exit 0, probe output)"
        if shutil.which(tool) is None:
            rows.append(Row(name, "SKIP", f"{tool} is not installed"))
            continue
        options = ["--url", ctx.url, "--send", str(probe)]
        if tool == "ncu":
            options += ["--out", str(ctx.work / "ncu-out")]
        command = [*base, tool, *options, "--", "python", "probe.py"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=ctx.tool_timeout)
        except subprocess.TimeoutExpired:
            rows.append(Row(name, "FAIL", f"timed out after {ctx.tool_timeout:g} s"))
            continue
        ok = done.returncode == 0 and "2048.0" in done.stdout
        tail = (done.stdout + done.stderr)[-300:]
        rows.append(Row(name, "PASS" if ok else "FAIL", f"exit {done.returncode}", {"tail": tail}))
    return rows


# ---------------------------------------------------------------------- driver


def visible_gpus() -> list[int]:
    import torch

    return list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []


def run_checks(args: argparse.Namespace, work: Path) -> list[Row]:
    if args.dry_run:
        all_gpus: list[int] = []
        device_args = ["--device", "cpu", "--num-workers", "2"]
    else:
        all_gpus = [int(g) for g in args.gpus.split(",") if g] if args.gpus else visible_gpus()
        if not all_gpus:
            return [Row("CUDA", "FAIL", "torch sees no CUDA GPU; use --dry-run on CPU machines")]
        device_args = ["--device", "gpu", "--gpus", str(all_gpus[0]), "--workers-per-gpu", "2"]
    rows: list[Row] = []
    with server(work, "main", device_args) as url:
        ctx = Check(url, args.dry_run, all_gpus, work, args.tool_timeout)
        checks: list[tuple[str, Callable[[], Row | list[Row]]]] = [
            ("tensor round trip", lambda: check_tensor_round_trip(ctx)),
            ("cupti-python", lambda: check_cupti(ctx)),
            ("benchmarks never overlap", lambda: check_benchmarks_never_overlap(ctx)),
            ("cpu_only lets others measure", lambda: check_cpu_only_lets_others_measure(ctx)),
            ("illegal access contained", lambda: check_illegal_access_is_contained(ctx)),
            ("matmul agreement", lambda: check_matmul_agreement(ctx)),
            ("compare two matmuls", lambda: check_compare_two_matmuls(ctx)),
            ("NVML readings", lambda: check_nvml_readings(ctx)),
            ("overhead per request", lambda: check_overhead(ctx)),
            ("kcoral run GPU tools", lambda: check_tools(ctx)),
            ("gpu_count with NCCL", lambda: check_gpu_count(ctx, all_gpus)),
        ]
        for name, check in checks:
            rows.extend(_guarded(name, check))
        ctx.client.close()
    return rows


def _guarded(name: str, check: Callable[[], Row | list[Row]]) -> list[Row]:
    try:
        outcome = check()
    except Exception as exc:  # one broken check must not hide the others
        return [Row(name, "FAIL", f"{type(exc).__name__}: {exc}")]
    return outcome if isinstance(outcome, list) else [outcome]


def markdown_table(rows: list[Row], dry_run: bool) -> str:
    """The table for the README: one line per row, cells without pipes or newlines."""

    def cell(text: object) -> str:
        return str(text).replace("|", "\\|").replace("\n", " ")

    environment = gpu_snapshot()
    devices = environment.get("devices") or []
    machine = ", ".join(sorted({str(d.get("name")) for d in devices})) or "no GPU"
    title = (
        f"KCoral GPU check, {time.strftime('%Y-%m-%d')}: {machine}, driver "
        f"{environment.get('driver', '?')}" + (" (dry run on a CPU server)" if dry_run else "")
    )
    lines = [title, "", "| check | status | clock | detail |", "| --- | --- | --- | --- |"]
    for row in rows:
        lines.append(
            f"| {cell(row.name)} | {row.status} | {cell(row.clock or '-')} | {cell(row.detail)} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="KCoral GPU truth check")
    parser.add_argument("--json", metavar="PATH", help="also write the table as JSON")
    parser.add_argument("--markdown", metavar="PATH", help="also write the Markdown table")
    parser.add_argument("--gpus", help="comma-separated GPU ids (default: every visible GPU)")
    parser.add_argument("--dry-run", action="store_true", help="CPU server, fake timings")
    parser.add_argument(
        "--tool-timeout", type=float, default=600.0, metavar="SECONDS",
        help="limit for each `kcoral run` GPU tool row (default 600)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    missing = missing_requirements(args.dry_run)
    if missing:
        print("gpu_check cannot run; missing:", file=sys.stderr)
        for line in missing:
            print(f"  - {line}", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))  # a source checkout works without installing
    with tempfile.TemporaryDirectory(prefix="kcoral-gpu-check-") as tmp:
        rows = run_checks(args, Path(tmp))
    table = markdown_table(rows, args.dry_run)
    print(table, end="")
    if args.markdown:
        Path(args.markdown).write_text(table)
    if args.json:
        report = {
            "dry_run": args.dry_run,
            "environment": gpu_snapshot(),
            "rows": [asdict(row) for row in rows],
        }
        Path(args.json).write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 1 if any(row.status == "FAIL" for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
