"""What a benchmark result says about the machine and the measurement (EXTENSIONS §12.4):
the NVML probe of a GPU worker's own GPU, the CPU machine's state otherwise, the rounds,
what stopped the measurement, and the warnings to read before trusting a number."""

from __future__ import annotations

from typing import Any

from kcoral.bench.clocks import CpuClock, CudaEventClock
from kcoral.bench.config import MAX_CALLS, BenchmarkConfig
from kcoral.bench.gpu_state import (
    NvmlProbe,
    cpu_machine_state,
    cpu_warnings,
    software_versions,
    torch_device_name,
)
from kcoral.bench.rounds import RoundsOutcome


def state_probe(clock: CpuClock | CudaEventClock) -> NvmlProbe | None:
    """An NVML probe of the worker's own GPU on a GPU clock, else ``None``."""
    if not isinstance(clock, CudaEventClock):
        return None
    return NvmlProbe.open()


def machine_report(
    probe: NvmlProbe | None, outcome: RoundsOutcome, settings: BenchmarkConfig
) -> dict[str, Any]:
    """``gpu_state`` or ``machine``, the ``warnings`` and the adaptive mode's verdict."""
    report: dict[str, Any] = {
        "rounds": outcome.rounds,
        "stopped_by": outcome.stopped_by,
        "target_precision": settings.target_precision,
        "max_ms": settings.max_ms if settings.target_precision is not None else None,
        "discard_throttled": settings.discard_throttled,
        "discarded_rounds": outcome.discarded_rounds,
        "label": settings.label,
        "cut_short": outcome.cut_short,
        "calls_asked": outcome.calls_asked,
    }
    if probe is None:
        machine = cpu_machine_state(outcome.others_busy_cpus)
        report["machine"] = machine
        report["gpu_state"] = None
        warnings = cpu_warnings(machine)
    else:
        report["machine"] = None
        report["gpu_state"] = probe.report(outcome.throttled_rounds, outcome.discarded_rounds)
        if not report["gpu_state"]["available"]:
            # the GPU kind without NVML, so history does not mix GPU kinds (§12.6)
            report["gpu_state"]["device_name"] = torch_device_name()
        warnings = probe.warnings(outcome.throttled_rounds, outcome.rounds)
        if outcome.throttled_rounds and settings.discard_throttled:
            if outcome.discarded_rounds:
                warnings.append(f"{outcome.discarded_rounds} throttled rounds were dropped")
            else:
                warnings.append("every round was throttled, so none was dropped")
    if outcome.stopped_by in ("max_ms", "max_calls") and settings.target_precision is not None:
        warnings.append(
            f"the median did not reach the target precision {settings.target_precision:g} "
            f"before {outcome.stopped_by} ended the measurement"
        )
    if outcome.stopped_by == "max_calls" and settings.target_precision is None:
        warnings.append(
            f"the measurement stopped at {MAX_CALLS} calls (max_calls), before the "
            "repeat count it was asked for"
        )
    if outcome.cut_short == "deadline":
        warnings.append(deadline_warning(outcome))
    report["warnings"] = warnings
    report["versions"] = software_versions(probe)
    return report


def deadline_warning(outcome: RoundsOutcome) -> str:
    """``stopped after N of M calls: the program's deadline of S s was near`` (without ``of
    M`` in the adaptive mode, which asks for no count)."""
    asked = f" of {outcome.calls_asked}" if outcome.calls_asked is not None else ""
    seconds = outcome.deadline_seconds
    deadline = "" if seconds is None else f" of {f'{seconds:.1f}'.removesuffix('.0')} s"
    return f"stopped after {outcome.calls}{asked} calls: the program's deadline{deadline} was near"
