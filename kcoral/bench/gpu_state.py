"""The state of the machine around a measurement (EXTENSIONS §12.4): GPU clocks, temperature,
power and throttle reasons through NVML on a GPU worker, the CPU governor and load on a CPU
worker, and the warnings a kernel author should see before trusting a number.

Who can reach what: the worker's sandbox shows only its own ``/dev/nvidiaN``, and NVML
enumerates GPUs by its own numbering, which need not match CUDA's. So the GPU is opened by
UUID, the one name both agree on: ``CUDA_VISIBLE_DEVICES`` carries it (the server sets UUIDs
there, SERVER §6), else torch's device properties. ``pynvml`` (nvidia-ml-py, the ``[gpu]``
extra) is imported only here, only when a helper runs; tests put a fake in ``sys.modules``.
"""

from __future__ import annotations

import importlib
import os
import platform
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from kcoral.bench.cpu_share import busy_threshold, usable_cpus

#: The SM clock may move by at most this share of its median across rounds for the clocks to
#: count as steady (EXTENSIONS §12.4); boost clocks typically move by 10–30 %.
CLOCK_DRIFT_SHARE = 0.02
#: GPU samples kept in a result (evenly spaced); the summary covers all of them.
MAX_STATE_SAMPLES = 64
#: NVML clock-event (throttle) reason bits that slow a kernel down. Idle, application clock
#: settings, sync boost and display clocks are not throttling.
THROTTLE_REASONS = {
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x20: "sw_thermal_slowdown",
    0x40: "hw_thermal_slowdown",
    0x80: "hw_power_brake_slowdown",
}
_NVML_CLOCK_SM = 1
_NVML_CLOCK_MEM = 2
_NVML_TEMPERATURE_GPU = 0


@dataclass(frozen=True)
class GpuSample:
    """One NVML reading."""

    sm_clock_mhz: int | None
    memory_clock_mhz: int | None
    temperature_c: int | None
    power_w: float | None
    throttle_reasons: tuple[str, ...]

    @property
    def throttled(self) -> bool:
        return bool(self.throttle_reasons)

    def as_json(self) -> dict[str, Any]:
        return {
            "sm_clock_mhz": self.sm_clock_mhz,
            "memory_clock_mhz": self.memory_clock_mhz,
            "temperature_c": self.temperature_c,
            "power_w": self.power_w,
            "throttle_reasons": list(self.throttle_reasons),
        }


def _optional(call: Any, *args: Any) -> Any:
    try:
        return call(*args)
    except Exception:
        return None  # a reading this GPU or driver does not offer is reported as null


def _worker_gpu_uuid() -> str | None:
    torch = sys.modules.get("torch")
    index = 0
    if torch is not None:
        try:
            index = int(torch.cuda.current_device())
        except Exception:
            index = 0
    visible = [part.strip() for part in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")]
    if index < len(visible) and visible[index].startswith(("GPU-", "MIG-")):
        return visible[index]
    if torch is not None:
        try:
            uuid = str(torch.cuda.get_device_properties(index).uuid)
        except Exception:
            return None
        return uuid if uuid.startswith(("GPU-", "MIG-")) else f"GPU-{uuid}"
    return None


@dataclass
class NvmlProbe:
    """Reads one GPU's state; ``unavailable`` says why it cannot (then ``sample`` is None)."""

    uuid: str | None = None
    name: str | None = None
    driver_version: str | None = None
    unavailable: str | None = None
    application_sm_clock_mhz: int | None = None
    default_application_sm_clock_mhz: int | None = None
    samples: list[GpuSample] = field(default_factory=list)
    _nvml: Any = None
    _handle: Any = None

    @classmethod
    def open(cls) -> NvmlProbe:
        try:
            nvml = importlib.import_module("pynvml")
        except ImportError:
            return cls(unavailable="nvidia-ml-py is not installed (pip install 'kcoral[gpu]')")
        except Exception as exc:
            return cls(unavailable=f"pynvml failed to load: {type(exc).__name__}: {exc}")
        uuid = _worker_gpu_uuid()
        if uuid is None:
            return cls(unavailable="the worker's GPU UUID is unknown, so NVML cannot open it")
        try:
            nvml.nvmlInit()
            handle = nvml.nvmlDeviceGetHandleByUUID(uuid)
        except Exception as exc:
            return cls(uuid=uuid, unavailable=f"NVML cannot open {uuid}: {type(exc).__name__}")
        name = _optional(nvml.nvmlDeviceGetName, handle)
        if isinstance(name, bytes):
            name = name.decode("utf-8", "replace")
        probe = cls(uuid=uuid, name=str(name) if name is not None else None)
        probe._nvml, probe._handle = nvml, handle
        driver = _optional(getattr(nvml, "nvmlSystemGetDriverVersion", None))
        if isinstance(driver, bytes):
            driver = driver.decode("utf-8", "replace")
        probe.driver_version = driver if isinstance(driver, str) else None
        probe.application_sm_clock_mhz = _optional(
            nvml.nvmlDeviceGetApplicationsClock, handle, _NVML_CLOCK_SM
        )
        probe.default_application_sm_clock_mhz = _optional(
            getattr(nvml, "nvmlDeviceGetDefaultApplicationsClock", None), handle, _NVML_CLOCK_SM
        )
        return probe

    def sample(self) -> GpuSample | None:
        if self._handle is None:
            return None
        nvml, handle = self._nvml, self._handle
        reasons_call = getattr(nvml, "nvmlDeviceGetCurrentClocksEventReasons", None) or getattr(
            nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None
        )
        bits = _optional(reasons_call, handle) or 0
        power = _optional(nvml.nvmlDeviceGetPowerUsage, handle)  # milliwatts
        reading = GpuSample(
            sm_clock_mhz=_optional(nvml.nvmlDeviceGetClockInfo, handle, _NVML_CLOCK_SM),
            memory_clock_mhz=_optional(nvml.nvmlDeviceGetClockInfo, handle, _NVML_CLOCK_MEM),
            temperature_c=_optional(nvml.nvmlDeviceGetTemperature, handle, _NVML_TEMPERATURE_GPU),
            power_w=float(power) / 1000 if isinstance(power, (int, float)) else None,
            throttle_reasons=tuple(
                name for bit, name in THROTTLE_REASONS.items() if int(bits) & bit
            ),
        )
        self.samples.append(reading)
        return reading

    def close(self) -> None:
        if self._nvml is not None:
            _optional(self._nvml.nvmlShutdown)
        self._nvml = self._handle = None

    def clocks_locked(self) -> tuple[bool, str | None]:
        """Whether the clocks count as locked, else why not (EXTENSIONS §12.4)."""
        app, default = self.application_sm_clock_mhz, self.default_application_sm_clock_mhz
        if app is None or default is None or app == default:
            return False, "no application clocks are set (nvidia-smi -ac), so boost clocks move"
        clocks = sorted(s.sm_clock_mhz for s in self.samples if s.sm_clock_mhz is not None)
        if clocks:
            middle = clocks[len(clocks) // 2]
            if middle > 0 and (clocks[-1] - clocks[0]) / middle > CLOCK_DRIFT_SHARE:
                return False, (
                    f"the SM clock moved from {clocks[0]} to {clocks[-1]} MHz, more than "
                    f"{CLOCK_DRIFT_SHARE:.0%} across rounds"
                )
        return True, None

    def report(self, throttled_rounds: int, discarded_rounds: int) -> dict[str, Any]:
        """The ``gpu_state`` key of a result."""
        if self.unavailable is not None:
            return {"available": False, "reason": self.unavailable, "uuid": self.uuid}
        locked, why = self.clocks_locked()
        clocks = [s.sm_clock_mhz for s in self.samples if s.sm_clock_mhz is not None]
        temperatures = [s.temperature_c for s in self.samples if s.temperature_c is not None]
        return {
            "available": True,
            "uuid": self.uuid,
            "name": self.name,
            "application_sm_clock_mhz": self.application_sm_clock_mhz,
            "default_application_sm_clock_mhz": self.default_application_sm_clock_mhz,
            "sm_clock_mhz_min": min(clocks, default=None),
            "sm_clock_mhz_max": max(clocks, default=None),
            "temperature_c_max": max(temperatures, default=None),
            "clocks_locked": locked,
            "clocks_unlocked_reason": why,
            "throttled_rounds": throttled_rounds,
            "discarded_rounds": discarded_rounds,
            "sample_count": len(self.samples),
            "samples": [s.as_json() for s in _evenly(self.samples, MAX_STATE_SAMPLES)],
        }

    def warnings(self, throttled_rounds: int, rounds: int) -> list[str]:
        if self.unavailable is not None:
            return [f"GPU state not read: {self.unavailable}"]
        found = []
        locked, why = self.clocks_locked()
        if not locked:
            found.append(f"clocks are not locked: {why}")
        if throttled_rounds:
            reasons = sorted({r for s in self.samples for r in s.throttle_reasons})
            found.append(
                f"the GPU throttled during {throttled_rounds} of {rounds} rounds "
                f"({', '.join(reasons)})"
            )
        return found


def torch_device_name() -> str | None:
    """The current CUDA device's name as torch reports it, when torch is already loaded (a
    GPU clock loaded it; never imported here), else ``None``: the GPU kind without NVML."""
    torch = sys.modules.get("torch")
    if torch is None:
        return None
    name = _optional(lambda: torch.cuda.get_device_name(torch.cuda.current_device()))
    return name if isinstance(name, str) and name else None


def software_versions(probe: NvmlProbe | None) -> dict[str, str | None]:
    """``versions`` of a result: the NVIDIA driver (NVML), CUDA and torch (torch, when
    already loaded); ``null`` where unknown. History warns when they change between runs."""
    torch = sys.modules.get("torch")
    cuda = getattr(getattr(torch, "version", None), "cuda", None)
    version = getattr(torch, "__version__", None)
    return {
        "driver": probe.driver_version if probe is not None else None,
        "cuda": cuda if isinstance(cuda, str) else None,
        "torch": str(version) if version is not None else None,
    }


def _evenly(items: Sequence[Any], limit: int) -> list[Any]:
    if len(items) <= limit:
        return list(items)
    step = (len(items) - 1) / (limit - 1)
    return [items[round(i * step)] for i in range(limit)]


# ---------------------------------------------------------------------- CPU workers


def cpu_machine_state(others_busy_cpus: float | None = None) -> dict[str, Any]:
    """What a CPU worker's machine offers for timing: frequency governor, load, CPU count,
    and the CPUs other processes kept busy during the measurement (``cpu_share``)."""
    governor = None
    try:
        with open("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor") as handle:
            governor = handle.read().strip() or None
    except OSError:
        pass  # containers and VMs often hide cpufreq: reported as null
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = None
    usable = usable_cpus()
    return {
        "cpu_model": _cpu_model(),
        "governor": governor,
        "load_average": load,
        "cpu_count": os.cpu_count(),
        "usable_cpus": len(usable) if usable is not None else os.cpu_count(),
        "others_busy_cpus": others_busy_cpus,
    }


def _cpu_model() -> str | None:
    """The CPU's model name (``/proc/cpuinfo``), so two runs of one history key on different
    machines can be told apart; ``None`` where the system does not say."""
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                name, _, value = line.partition(":")
                if name.strip() in ("model name", "Model", "cpu model") and value.strip():
                    return value.strip()[:200]
    except OSError:
        pass
    return platform.processor() or None


def cpu_warnings(machine: dict[str, Any]) -> list[str]:
    found = ["CPU worker: times are host wall-clock (perf_counter_ns), not GPU time"]
    governor = machine.get("governor")
    if governor is not None and governor != "performance":
        found.append(f"the CPU frequency governor is {governor!r}, not 'performance'")
    # Not the load average: it counts the measuring process itself (cpu_share).
    others = machine.get("others_busy_cpus")
    cpus = machine.get("usable_cpus") or machine.get("cpu_count") or 1
    if others is not None and others >= busy_threshold(cpus):
        found.append(
            f"other processes kept {others:g} of the {cpus} CPUs it may use busy during the "
            "measurement"
        )
    return found
