"""``kcoral.builtins``: benchmark on the CPU clock, the CUDA-event and CUPTI clocks driven by
stand-ins for torch and cupti (no GPU here), configuration rules, message truncation and
``compile_tirx`` without TVM."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest

from kcoral import builtins
from kcoral.bench.config import TRUNCATION_MARK, calls_for_budget, parse_config, truncate_message
from kcoral.builtins import benchmark, compile_tirx
from kcoral.protocol.errors import ExecutionError

RESULT_KEYS = {
    "latency_ms_median",
    "latency_ms_mean",
    "latency_ms_min",
    "latency_ms_max",
    "activities_stable",
    "flush_l2",
    "warmup",
    "repeat",
    "clock",
    "clock_fallback",
}


def test_importing_the_builtins_loads_no_gpu_library() -> None:
    code = textwrap.dedent(
        """
        import sys
        import kcoral.builtins
        heavy = ["torch", "tvm_ffi", "tvm", "tvm_tirx", "cupti", "tornado", "numpy"]
        print(",".join(name for name in heavy if name in sys.modules))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    loaded = set(filter(None, out.stdout.strip().split(",")))
    assert loaded <= {"numpy"}  # numpy is a core dependency of kcoral itself


# ---------------------------------------------------------------------- truncation


def test_a_short_message_is_kept_as_is() -> None:
    assert truncate_message("x" * 600) == "x" * 600


def test_a_long_message_keeps_its_start_and_end_within_600_characters() -> None:
    text = "START" + "m" * 2000 + "END"
    short = truncate_message(text)
    assert len(short) == 600
    assert short.startswith("START")
    assert short.endswith("END")
    assert TRUNCATION_MARK in short
    assert TRUNCATION_MARK == "…[truncated]…"


def test_a_helper_error_with_a_huge_message_is_truncated() -> None:
    def noisy() -> None:
        raise RuntimeError("boom " * 1000)

    with pytest.raises(ExecutionError) as info:
        benchmark(noisy, {"warmup": 1, "repeat": 1, "flush_l2": False})
    assert info.value.kind == "runtime"
    assert len(info.value.message) == 600
    assert info.value.message.startswith("benchmark: RuntimeError: boom")


# ---------------------------------------------------------------------- configuration


def test_the_default_configuration_matches_the_spec() -> None:
    config = parse_config(None)
    assert (config.warmup_ms, config.repeat_ms, config.flush_l2) == (25.0, 100.0, True)
    assert config.warmup is None and config.repeat is None


@pytest.mark.parametrize(
    "config",
    [
        {"warmups": 3},
        {"warmup": 0},
        {"repeat": -1},
        {"repeat": 2.0},
        {"warmup": True},
        {"warmup_ms": "10"},
        {"repeat_ms": float("nan")},
        {"repeat_ms": -1},
        {"flush_l2": 1},
    ],
)
def test_a_bad_configuration_fails_with_runtime(config: dict) -> None:
    with pytest.raises(ExecutionError) as info:
        benchmark(lambda: None, config)
    assert info.value.kind == "runtime"
    assert "benchmark config" in info.value.message


def test_budgets_become_call_counts() -> None:
    assert calls_for_budget(100.0, 3.0) == 33
    assert calls_for_budget(1.0, 5.0) == 1
    assert calls_for_budget(100.0, 0.0) == 1000


# ---------------------------------------------------------------------- CPU clock


def test_explicit_counts_skip_the_estimate_and_run_exactly_those_calls() -> None:
    calls = []
    result = benchmark(lambda x: calls.append(x), 7, {"warmup": 2, "repeat": 3, "flush_l2": False})
    assert calls == [7] * 5
    assert RESULT_KEYS <= set(result)  # the published keys stay; EXTENSIONS §12 adds more
    assert (result["warmup"], result["repeat"], result["clock"]) == (2, 3, "cpu")
    assert result["activities_stable"] is True
    assert result["flush_l2"] is False


def test_the_trailing_dict_is_the_configuration_and_never_reaches_the_function() -> None:
    seen = []
    benchmark(lambda *a: seen.append(a), 1, {"a": 2}, {"warmup": 1, "repeat": 1})
    assert seen == [(1, {"a": 2})] * 2


def test_budgets_use_one_untimed_call_and_five_estimate_calls() -> None:
    calls = []
    result = benchmark(lambda: calls.append(1), {"warmup_ms": 0, "repeat_ms": 0})
    # 0 ms budgets give one call each: 1 untimed + 5 estimate + 1 warm-up + 1 measured
    assert (result["warmup"], result["repeat"]) == (1, 1)
    assert len(calls) == 8


def test_an_explicit_count_overrides_only_its_own_budget() -> None:
    result = benchmark(lambda: None, {"repeat": 4, "warmup_ms": 0, "flush_l2": False})
    assert result["repeat"] == 4
    assert result["warmup"] == 1


def test_cpu_latencies_are_ordered_and_positive() -> None:
    result = benchmark(sum, range(1000), {"warmup": 1, "repeat": 5})
    assert 0 < result["latency_ms_min"] <= result["latency_ms_median"] <= result["latency_ms_max"]
    assert result["latency_ms_min"] <= result["latency_ms_mean"] <= result["latency_ms_max"]
    assert result["flush_l2"] is True


def test_a_function_that_raises_fails_with_runtime() -> None:
    def broken() -> None:
        raise ValueError("bad shape")

    with pytest.raises(ExecutionError) as info:
        benchmark(broken, {"warmup": 1, "repeat": 1})
    assert info.value.kind == "runtime"
    assert info.value.message == "benchmark: ValueError: bad shape"


def test_an_execution_error_raised_by_the_function_keeps_its_kind() -> None:
    def wrong() -> None:
        raise ExecutionError("correctness", "result mismatch")

    with pytest.raises(ExecutionError) as info:
        benchmark(wrong, {"warmup": 1, "repeat": 1})
    assert (info.value.kind, info.value.message) == ("correctness", "result mismatch")


def test_a_function_that_is_not_callable_fails_with_runtime() -> None:
    with pytest.raises(ExecutionError) as info:
        benchmark(42, {"warmup": 1, "repeat": 1})
    assert info.value.kind == "runtime"
    assert "not callable" in info.value.message


# ---------------------------------------------------------------------- GPU clocks, faked


class VirtualTime:
    """A clock that only moves when the fake GPU "runs" something."""

    def __init__(self) -> None:
        self.ns = 1_000_000

    def advance_ms(self, ms: float) -> None:
        self.ns += int(ms * 1e6)


def fake_torch(clock: VirtualTime) -> SimpleNamespace:
    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            assert enable_timing
            self.at: int | None = None

        def record(self) -> None:
            self.at = clock.ns

        def elapsed_time(self, other: Event) -> float:
            assert self.at is not None and other.at is not None
            return (other.at - self.at) / 1e6

    class Buffer:
        zeroed = 0

        def zero_(self) -> None:
            Buffer.zeroed += 1
            clock.advance_ms(0.5)  # the flush takes GPU time, outside the measured span

    cuda = SimpleNamespace(
        is_initialized=lambda: True,
        current_device=lambda: 0,
        get_device_properties=lambda device: SimpleNamespace(L2_cache_size=50 * 1024**2),
        synchronize=lambda: None,
        Event=Event,
    )
    return SimpleNamespace(
        cuda=cuda, uint8="uint8", empty=lambda size, dtype, device: Buffer(), Buffer=Buffer
    )


def test_without_cupti_a_gpu_worker_times_calls_with_cuda_events(monkeypatch) -> None:
    clock = VirtualTime()
    torch = fake_torch(clock)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "cupti", None)
    monkeypatch.setitem(sys.modules, "cupti.cupti", None)
    result = benchmark(lambda: clock.advance_ms(2.0), {"warmup": 2, "repeat": 3})
    assert result["clock"] == "cuda_events"
    assert result["clock_fallback"] == "cupti-python is not installed (pip install 'kcoral[gpu]')"
    assert result["latency_ms_median"] == pytest.approx(2.0)
    assert result["latency_ms_max"] == pytest.approx(2.0)
    assert result["activities_stable"] is True
    assert torch.Buffer.zeroed == 5  # one flush before every warm-up and measured call


def test_the_cuda_event_estimate_turns_budgets_into_counts(monkeypatch) -> None:
    clock = VirtualTime()
    monkeypatch.setitem(sys.modules, "torch", fake_torch(clock))
    monkeypatch.setitem(sys.modules, "cupti.cupti", None)
    result = benchmark(lambda: clock.advance_ms(1.5), {"warmup_ms": 20, "repeat_ms": 40})
    # per-call estimate = 1.5 ms of work + 0.5 ms flush = 2 ms
    assert (result["warmup"], result["repeat"]) == (10, 20)


class FakeCupti:
    """Enough of ``cupti.cupti`` for activity tracing: the fake GPU reports activities."""

    ActivityKind = SimpleNamespace(CONCURRENT_KERNEL=10, MEMCPY=1, MEMCPY2=22, MEMSET=2)

    def __init__(self, clock: VirtualTime) -> None:
        self.clock = clock
        self.pending: list[SimpleNamespace] = []
        self.enabled: set[int] = set()
        self.completed = None

    def activity_register_callbacks(self, requested, completed) -> None:
        assert requested() == (8 * 1024 * 1024, 0)
        self.completed = completed

    def activity_enable(self, kind: int) -> None:
        self.enabled.add(kind)

    def activity_disable(self, kind: int) -> None:
        self.enabled.discard(kind)

    def get_timestamp(self) -> int:
        return self.clock.ns

    def activity_flush_all(self, flag: int) -> None:
        assert flag == 1
        records, self.pending = self.pending, []
        self.completed(records)

    def kernel(self, name: str, ms: float, gap_ms: float = 0.0) -> None:
        self.clock.advance_ms(gap_ms)
        start = self.clock.ns
        self.clock.advance_ms(ms)
        self.pending.append(SimpleNamespace(kind=10, name=name, start=start, end=self.clock.ns))


def install_cupti(monkeypatch, clock: VirtualTime) -> FakeCupti:
    cupti = FakeCupti(clock)
    monkeypatch.setitem(sys.modules, "torch", fake_torch(clock))
    monkeypatch.setitem(sys.modules, "cupti", SimpleNamespace(cupti=cupti))
    monkeypatch.setitem(sys.modules, "cupti.cupti", cupti)
    return cupti


def test_with_cupti_the_span_runs_from_the_first_activity_start_to_the_last_end(
    monkeypatch,
) -> None:
    clock = VirtualTime()
    cupti = install_cupti(monkeypatch, clock)

    def two_kernels() -> None:
        clock.advance_ms(5.0)  # host work before the first launch does not count
        cupti.kernel("gemm", 1.0)
        cupti.kernel("epilogue", 0.5, gap_ms=0.25)  # a host gap between activities counts

    result = benchmark(two_kernels, {"warmup": 1, "repeat": 4})
    assert result["clock"] == "cupti"
    assert result["latency_ms_median"] == pytest.approx(1.75)
    assert result["latency_ms_min"] == pytest.approx(1.75)
    assert result["activities_stable"] is True
    assert cupti.enabled == set()  # tracing is switched off again afterwards


def test_calls_that_launch_different_activities_are_reported_unstable(monkeypatch) -> None:
    clock = VirtualTime()
    cupti = install_cupti(monkeypatch, clock)
    names = iter(["a", "a", "b", "a"])
    result = benchmark(lambda: cupti.kernel(next(names), 1.0), {"warmup": 1, "repeat": 3})
    assert result["activities_stable"] is False


def test_one_call_without_recorded_gpu_activity_among_others_is_unavailable(monkeypatch) -> None:
    clock = VirtualTime()
    cupti = install_cupti(monkeypatch, clock)
    launches = iter([True, True, False, True])  # warm-up, then three measured calls

    def sometimes() -> None:
        if next(launches):
            cupti.kernel("k", 1.0)
        else:
            clock.advance_ms(1.0)

    with pytest.raises(ExecutionError) as info:
        benchmark(sometimes, {"warmup": 1, "repeat": 3})
    assert info.value.kind == "unavailable"


def test_a_cupti_that_records_nothing_at_all_falls_back_to_cuda_events(monkeypatch) -> None:
    clock = VirtualTime()
    install_cupti(monkeypatch, clock)
    result = benchmark(lambda: clock.advance_ms(1.0), {"warmup": 1, "repeat": 2})
    assert result["clock"] == "cuda_events"
    assert result["clock_fallback"] == "CUPTI recorded no GPU activity for any measured call"
    assert result["latency_ms_median"] == pytest.approx(1.0)
    assert result["repeat"] == 2


def test_a_cupti_that_fails_to_start_falls_back_to_cuda_events_and_says_why(monkeypatch) -> None:
    clock = VirtualTime()
    cupti = install_cupti(monkeypatch, clock)

    def refuse(kind: int) -> None:
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED")

    cupti.activity_enable = refuse
    result = benchmark(lambda: clock.advance_ms(3.0), {"warmup": 1, "repeat": 1})
    assert result["clock"] == "cuda_events"
    assert "CUPTI_ERROR_NOT_INITIALIZED" in result["clock_fallback"]
    assert result["latency_ms_median"] == pytest.approx(3.0)


def test_a_cupti_whose_library_does_not_load_falls_back_to_cuda_events(monkeypatch) -> None:
    clock = VirtualTime()
    monkeypatch.setitem(sys.modules, "torch", fake_torch(clock))
    monkeypatch.delitem(sys.modules, "cupti.cupti", raising=False)
    real_import = builtins.importlib.import_module

    def broken_import(name: str, *args):
        if name == "cupti.cupti":
            raise OSError("libcupti.so.13: cannot open shared object file")
        return real_import(name, *args)

    monkeypatch.setattr(builtins.importlib, "import_module", broken_import)
    result = benchmark(lambda: clock.advance_ms(1.0), {"warmup": 1, "repeat": 1})
    assert result["clock"] == "cuda_events"
    assert result["clock_fallback"] == (
        "CUPTI failed to load: OSError: libcupti.so.13: cannot open shared object file"
    )


def test_a_cupti_flush_failure_redoes_the_measurement_with_cuda_events(monkeypatch) -> None:
    clock = VirtualTime()
    cupti = install_cupti(monkeypatch, clock)
    calls = []

    def flush_fails(flag: int) -> None:
        raise RuntimeError("CUPTI_ERROR_INVALID_DEVICE")

    cupti.activity_flush_all = flush_fails

    def work() -> None:
        calls.append(1)
        cupti.kernel("k", 2.0)

    result = benchmark(work, {"warmup": 1, "repeat": 3})
    assert result["clock"] == "cuda_events"
    assert "CUPTI flush failed" in result["clock_fallback"]
    assert result["latency_ms_median"] == pytest.approx(2.0)
    assert len(calls) == 1 + 3 + 3  # warm-up, the CUPTI attempt, the CUDA-event redo
    assert cupti.enabled == set()


def test_with_working_cupti_there_is_no_fallback(monkeypatch) -> None:
    clock = VirtualTime()
    cupti = install_cupti(monkeypatch, clock)
    result = benchmark(lambda: cupti.kernel("k", 1.0), {"warmup": 1, "repeat": 1})
    assert (result["clock"], result["clock_fallback"]) == ("cupti", None)


def test_a_cpu_worker_with_torch_imported_but_no_cuda_uses_the_cpu_clock(monkeypatch) -> None:
    torch = fake_torch(VirtualTime())
    torch.cuda.is_initialized = lambda: False
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert benchmark(lambda: None, {"warmup": 1, "repeat": 1})["clock"] == "cpu"


# ---------------------------------------------------------------------- compile_tirx


def test_compile_tirx_without_tvm_is_unavailable(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "tvm", None)
    monkeypatch.setitem(sys.modules, "tvm_tirx", None)
    with pytest.raises(ExecutionError) as info:
        compile_tirx(object())
    assert info.value.kind == "unavailable"


def fake_tvm(compiled: list) -> SimpleNamespace:
    class Function:
        def __init__(self, body: str) -> None:
            self.body = body

    class JitKernel:
        def specialize(self, **constexprs):
            if set(constexprs) != {"N"}:
                raise TypeError(f"missing constexpr arg(s): {sorted({'N'} - set(constexprs))}")
            return Function(f"n={constexprs['N']}")

    def compile_function(function, target):
        assert target == "cuda"
        compiled.append(function.body)
        if function.body == "broken":
            raise RuntimeError("lowering failed")
        return f"executable({function.body})"

    return SimpleNamespace(
        tirx=SimpleNamespace(Function=Function, compile=compile_function),
        ir=SimpleNamespace(
            structural_hash=lambda f: hash(f.body),
            structural_equal=lambda a, b: a.body == b.body,
        ),
        Function=Function,
        JitKernel=JitKernel,
    )


def test_compile_tirx_compiles_prim_funcs_and_specialized_jit_kernels_once(monkeypatch) -> None:
    compiled: list[str] = []
    tvm = fake_tvm(compiled)
    monkeypatch.setitem(sys.modules, "tvm_tirx", tvm)
    monkeypatch.setattr(builtins, "_tirx_cache", builtins.OrderedDict())
    assert compile_tirx(tvm.Function("add")) == "executable(add)"
    assert compile_tirx(tvm.Function("add")) == "executable(add)"
    assert compile_tirx(tvm.JitKernel(), {"N": 8}) == "executable(n=8)"
    assert compiled == ["add", "n=8"]


@pytest.mark.parametrize(
    ("kernel", "bindings", "kind"),
    [
        ("prim", [("N", 1)], "compile"),  # bindings not a dict
        ("prim", {"N": 1}, "compile"),  # bindings for a prim_func
        ("jit", {}, "compile"),  # missing constexpr
        ("other", None, "compile"),  # not a kernel at all
        ("broken", None, "compile"),  # lowering failure
    ],
)
def test_compile_tirx_misuse_and_failures_fail_with_compile(
    monkeypatch, kernel, bindings, kind
) -> None:
    tvm = fake_tvm([])
    monkeypatch.setitem(sys.modules, "tvm_tirx", tvm)
    monkeypatch.setattr(builtins, "_tirx_cache", builtins.OrderedDict())
    target = {
        "prim": tvm.Function("add"),
        "jit": tvm.JitKernel(),
        "other": object(),
        "broken": tvm.Function("broken"),
    }[kernel]
    with pytest.raises(ExecutionError) as info:
        compile_tirx(target, bindings)
    assert info.value.kind == kind


def test_a_tirx_parse_diagnostic_fails_with_parse(monkeypatch) -> None:
    tvm = fake_tvm([])

    class DiagnosticError(Exception):
        pass

    class BadKernel:
        def specialize(self, **constexprs):
            raise DiagnosticError("line 3: undefined name 'x'")

    monkeypatch.setitem(sys.modules, "tvm_tirx", tvm)
    with pytest.raises(ExecutionError) as info:
        compile_tirx(BadKernel(), {"N": 1})
    assert info.value.kind == "parse"


def test_a_cupti_python_missing_a_dependency_is_reported_as_a_load_failure(monkeypatch) -> None:
    clock = VirtualTime()
    monkeypatch.setitem(sys.modules, "torch", fake_torch(clock))
    monkeypatch.delitem(sys.modules, "cupti.cupti", raising=False)
    real_import = builtins.importlib.import_module

    def missing_dependency(name: str, *args):
        if name == "cupti.cupti":
            raise ModuleNotFoundError("No module named 'cuda'", name="cuda")
        return real_import(name, *args)

    monkeypatch.setattr(builtins.importlib, "import_module", missing_dependency)
    result = benchmark(lambda: clock.advance_ms(1.0), {"warmup": 1, "repeat": 1})
    assert result["clock"] == "cuda_events"
    assert result["clock_fallback"] == (
        "CUPTI failed to load: ModuleNotFoundError: No module named 'cuda'"
    )
