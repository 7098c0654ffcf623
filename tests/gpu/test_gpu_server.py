"""Every GPU path end to end against a real ``kcoral server --device gpu`` (``pytest -m gpu``).

The server (conftest ``gpu_server``) runs GPU 0 with two reused workers and
``--sandbox none``. Order and exclusivity are shown by the server's own lease timings and by
timestamps the programs write, never by wall-clock thresholds. Without a CUDA GPU every test
here is skipped with the reason (conftest). ``benchmarks/gpu_device_run.sh`` runs this file
on a rented GPU machine; ``benchmarks/gpu_check.py`` holds the timing comparisons.
"""

from __future__ import annotations

import json
import sys
import threading
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from cuda_programs import CUDA_SOURCE, HARNESS, nvcc_path
from waiting import wait_for_file

import kcoral
from kcoral.protocol.dtypes import DTYPES, numpy_dtype

pytestmark = [pytest.mark.gpu, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]

TENSORS = """
def describe(*tensors):
    return [str(t.device) for t in tensors]


def echo(*tensors):
    return list(tensors)


def made_on_gpu(name):
    import torch
    dtype = getattr(torch, name)
    base = torch.arange(-7, 8, device="cuda", dtype=torch.float32).reshape(3, 5)
    if name == "bool":
        return base > 0
    if name.startswith("uint"):
        return base.abs().to(dtype)
    return base.to(dtype)
"""

LEASE = """
import time


def hold(marker, cycles):
    import torch
    torch.cuda.synchronize()
    start = time.time()
    open(marker, "w").close()
    torch.cuda._sleep(cycles)  # keeps the GPU busy for about a second
    torch.cuda.synchronize()
    return [start, time.time()]
"""

CPU_ONLY = """
import os
import time


def compile_step(marker, wait_for, limit_seconds):
    # stands in for a compiler run: waits (off the GPU) until the other request measured
    open(marker, "w").close()
    deadline = time.monotonic() + limit_seconds
    while not os.path.exists(wait_for) and time.monotonic() < deadline:
        time.sleep(0.05)
    return os.path.exists(wait_for)


def measure(done_file):
    import torch
    from kcoral.builtins import benchmark
    a = torch.randn(1024, 1024, device="cuda")
    report = benchmark(lambda: a @ a, {"warmup": 3, "repeat": 10})
    open(done_file, "w").close()
    return report


def honest_cpu_work():
    import torch
    x = torch.randn(64, 64, requires_grad=True)
    with torch.profiler.profile() as profile:
        (x @ x).sum().backward()
    return [float(x.grad.abs().sum()) > 0, len(profile.key_averages()) > 0]


def touches_the_gpu():
    import torch
    return float(torch.ones(4, device="cuda").sum())
"""

ILLEGAL = """
import torch

try:
    import triton
    import triton.language as tl

    @triton.jit
    def poke(pointer):
        tl.store(pointer + (1 << 40), 1.0)  # 4 TiB past a 4-byte buffer
except ImportError:
    poke = None


def illegal_access():
    x = torch.zeros(1, device="cuda")
    poke[(1,)](x)
    torch.cuda.synchronize()


def small_sum(n):
    return float(torch.arange(n, device="cuda", dtype=torch.float32).sum())
"""

STREAMS = """
def call_on_stream(fn, x):
    import torch
    y = torch.empty_like(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn(x, y, stream.cuda_stream)
    torch.cuda.current_stream().wait_stream(stream)
    return [y, str(y.device)]
"""


def execute(url: str, program: kcoral.Program, **options: Any) -> Any:
    with kcoral.Client(url) as client:
        return client.execute(program, timeout_seconds=300, **options)


def _get_json(url: str, path: str) -> dict[str, Any]:
    with urllib.request.urlopen(url + path, timeout=30) as answer:
        return json.load(answer)


def cupti_available(url: str) -> bool:
    return bool(_get_json(url, "/v1/info")["optional"]["cupti"]["available"])


def in_background(call) -> tuple[threading.Thread, list]:
    out: list = []
    thread = threading.Thread(target=lambda: out.append(call()))
    thread.start()
    return thread, out


def sample(dtype: str) -> np.ndarray:
    base = np.arange(-7, 8, dtype=np.float32).reshape(3, 5)
    if dtype == "bool":
        return base > 0
    if dtype.startswith("uint"):
        return np.abs(base).astype(numpy_dtype(dtype))
    return base.astype(numpy_dtype(dtype))


# ---------------------------------------------------------------------- start-up


def test_the_gpu_server_started_from_the_readme_install_and_reports_its_pieces(
    gpu_server,
) -> None:
    health = _get_json(gpu_server.url, "/health")
    assert health["gpu_count"] == 1
    assert health["target"]["arch"].startswith("sm_")
    assert "torch" in health["versions"]
    optional = _get_json(gpu_server.url, "/v1/info")["optional"]
    assert set(optional) == {"library-upload", "cupti"}
    for piece in optional.values():
        assert piece["available"] or "pip install 'kcoral[gpu]'" in piece["reason"]
    ready = [e for e in gpu_server.events() if e["event"] == "worker_ready"]
    assert {e["device"] for e in ready} == {"gpu"}


# ---------------------------------------------------------------------- tensors


def test_cuda_tensors_of_all_12_dtypes_go_in_and_come_back_out(gpu_server) -> None:
    assert len(DTYPES) == 12
    program = kcoral.Program()
    module = program.upload(kind="module", source=TENSORS)
    uploaded = [program.upload(kind="tensor", value=sample(dtype)) for dtype in DTYPES]
    describe = program.get_function(module=module, name="describe")
    echo = program.get_function(module=module, name="echo")
    made = program.get_function(module=module, name="made_on_gpu")
    program.return_(key="devices", value=program.run(fn=describe, args=uploaded))
    program.return_(key="echoed", value=program.run(fn=echo, args=uploaded))
    for dtype in DTYPES:  # the wire names are torch's attribute names
        program.return_(key=f"made_{dtype}", value=program.run(fn=made, args=[dtype]))
    result = execute(gpu_server.url, program)
    assert result.status == "COMPLETED", result.error
    assert set(result.results["devices"]) == {"cuda:0"}
    for dtype, back in zip(DTYPES, result.results["echoed"], strict=True):
        original = sample(dtype)
        assert (back.shape, back.tobytes()) == (original.shape, original.tobytes()), dtype
        made = result.results[f"made_{dtype}"]
        assert made.tobytes() == original.tobytes(), dtype


# ---------------------------------------------------------------------- leases


def test_two_overlapping_requests_hold_the_gpu_lease_one_after_the_other(
    gpu_server, tmp_path
) -> None:
    def program(marker: Path) -> kcoral.Program:
        built = kcoral.Program()
        module = built.upload(kind="module", source=LEASE)
        hold = built.get_function(module=module, name="hold")
        built.return_(key="window", value=built.run(fn=hold, args=[str(marker), 2_000_000_000]))
        return built

    first_marker, second_marker = tmp_path / "first", tmp_path / "second"
    thread, first_out = in_background(lambda: execute(gpu_server.url, program(first_marker)))
    wait_for_file(first_marker, 120.0)  # the first request holds the lease now
    second = execute(gpu_server.url, program(second_marker))
    thread.join()
    first = first_out[0]
    assert first.status == second.status == "COMPLETED", (first.error, second.error)
    (a_start, a_end), (b_start, b_end) = first.results["window"], second.results["window"]
    assert a_start <= a_end and b_start <= b_end
    assert a_end <= b_start  # the second one's GPU work began after the first one's ended
    assert second.lease_wait_ms > 0  # and the server says it waited for the lease
    assert first.lease_held_ms > 0 and second.lease_held_ms > 0
    for result in (first, second):
        assert result.elapsed_ms >= result.lease_wait_ms + result.lease_held_ms - 1


def test_a_cpu_only_compile_step_lets_another_request_measure(gpu_server, tmp_path) -> None:
    compiling_marker, measured = tmp_path / "compiling", tmp_path / "measured"
    compiling = kcoral.Program()
    module = compiling.upload(kind="module", source=CPU_ONLY)
    step = compiling.get_function(module=module, name="compile_step", cpu_only=True)
    compiling.return_(
        key="saw_measurement",
        value=compiling.run(fn=step, args=[str(compiling_marker), str(measured), 120.0]),
    )
    if not cupti_available(gpu_server.url):
        result = execute(gpu_server.url, compiling)
        assert result.status == "FAILED"
        assert result.error["kind"] == "unavailable"
        assert "pip install 'kcoral[gpu]'" in result.error["message"]
        pytest.skip("cupti-python is not installed in the GPU workers: cpu_only runs are refused")
    measuring = kcoral.Program()
    module = measuring.upload(kind="module", source=CPU_ONLY)
    measure = measuring.get_function(module=module, name="measure")
    measuring.return_(key="report", value=measuring.run(fn=measure, args=[str(measured)]))
    thread, compiled = in_background(lambda: execute(gpu_server.url, compiling))
    wait_for_file(compiling_marker, 120.0)
    measurement = execute(gpu_server.url, measuring)
    thread.join()
    assert measurement.status == "COMPLETED", measurement.error
    assert measurement.results["report"]["clock"] in {"cupti", "cuda_events"}
    assert compiled[0].status == "COMPLETED", compiled[0].error
    # the compile step saw the other request finish its GPU measurement while it ran
    assert compiled[0].results["saw_measurement"] is True


def test_torch_bookkeeping_passes_the_cpu_only_watch_and_gpu_work_fails_it(gpu_server) -> None:
    if not cupti_available(gpu_server.url):
        pytest.skip("cupti-python is not installed in the GPU workers: no cpu_only watch")
    honest = kcoral.Program()
    module = honest.upload(kind="module", source=CPU_ONLY)
    work = honest.get_function(module=module, name="honest_cpu_work", cpu_only=True)
    honest.return_(key="out", value=honest.run(fn=work))
    dishonest = kcoral.Program()
    module = dishonest.upload(kind="module", source=CPU_ONLY)
    touch = dishonest.get_function(module=module, name="touches_the_gpu", cpu_only=True)
    dishonest.run(fn=touch)
    passed = execute(gpu_server.url, honest)
    caught = execute(gpu_server.url, dishonest)
    assert passed.status == "COMPLETED", passed.error  # a CPU backward pass and torch.profiler
    assert passed.results["out"] == [True, True]
    assert caught.status == "FAILED"
    assert caught.error["kind"] == "gpu_access"
    assert caught.error["cuda_call"]


# ---------------------------------------------------------------------- faults


def test_an_illegal_memory_access_fails_only_its_request(gpu_server) -> None:
    pytest.importorskip("triton", reason="triton makes the out-of-bounds kernel")
    bad = kcoral.Program()
    module = bad.upload(kind="module", source=ILLEGAL)
    bad.run(fn=bad.get_function(module=module, name="illegal_access"))
    good = kcoral.Program()
    module = good.upload(kind="module", source=ILLEGAL)
    small = good.get_function(module=module, name="small_sum")
    good.return_(key="sum", value=good.run(fn=small, args=[100]))
    failed = execute(gpu_server.url, bad)
    after = [execute(gpu_server.url, good) for _ in range(3)]  # whichever worker takes it
    assert failed.status == "FAILED"
    assert failed.error["kind"] == "runtime"
    assert "illegal" in failed.error["message"].lower()
    for result in after:
        assert result.status == "COMPLETED", result.error
        assert result.results["sum"] == 4950.0


# ---------------------------------------------------------------------- libraries, CUDA source


def test_a_library_upload_takes_and_returns_cuda_tensors_on_a_stream(
    gpu_server, cuda_library
) -> None:
    x = np.arange(1000, dtype=np.float32)
    program = kcoral.Program()
    library = program.upload(kind="library", value=cuda_library)
    add_one = program.get_function(module=library, name="add_one")
    harness = program.upload(kind="module", source=STREAMS)
    call = program.get_function(module=harness, name="call_on_stream")
    tensor = program.upload(kind="tensor", value=x)
    program.return_(key="out", value=program.run(fn=call, args=[add_one, tensor]))
    result = execute(gpu_server.url, program)
    assert result.status == "COMPLETED", result.error
    y, device = result.results["out"]
    assert device == "cuda:0"
    np.testing.assert_array_equal(y, x + 1)


def test_a_cuda_source_module_is_compiled_then_launched_on_a_torch_stream(gpu_server) -> None:
    nvcc = nvcc_path()
    if nvcc is None:
        pytest.skip("no CUDA toolkit: nvcc is not installed")
    arch = _get_json(gpu_server.url, "/health")["target"]["arch"]
    cpu_only = cupti_available(gpu_server.url)  # a compile step, watched when CUPTI is there
    x = np.linspace(-1, 1, 4096, dtype=np.float32)
    program = kcoral.Program()
    kernel_module = program.upload(kind="module", source=CUDA_SOURCE, language="cuda")
    kernel = program.get_function(module=kernel_module, name="scale")
    harness = program.upload(kind="module", source=HARNESS)
    build = program.get_function(module=harness, name="build", cpu_only=cpu_only)
    launch = program.get_function(module=harness, name="launch")
    built = program.run(fn=build, args=[kernel, nvcc, arch])
    tensor = program.upload(kind="tensor", value=x)
    program.return_(key="y", value=program.run(fn=launch, args=[built, "scale", tensor]))
    result = execute(gpu_server.url, program)
    assert result.status == "COMPLETED", result.error
    np.testing.assert_allclose(result.results["y"], 2 * x + 1, rtol=1e-6)


# ---------------------------------------------------------------------- several GPUs


def test_gpu_count_2_runs_an_nccl_all_reduce_when_two_gpus_exist(server_factory) -> None:
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip(f"{torch.cuda.device_count()} GPU here: gpu_count 2 with NCCL needs two")
    import server_process

    saved = server_process.START_TIMEOUT_SECONDS
    server_process.START_TIMEOUT_SECONDS = max(saved, 300.0)
    try:
        server = server_factory("--device", "gpu", "--gpus", "0,1", "--workers-per-gpu", "1")
    finally:
        server_process.START_TIMEOUT_SECONDS = saved
    sys.path.insert(0, str(ROOT / "examples"))
    try:
        from nccl_allreduce import build_program
    finally:
        sys.path.pop(0)
    result = execute(server.url, build_program(), gpu_count=2)
    assert result.status == "COMPLETED", result.error
    assert list(result.gpu_ids) == [0, 1]
    assert result.results["report"]["world_size"] == 2
