"""Stand-ins for a GPU on a machine without one: a torch whose CUDA events read a virtual
clock that only the "kernels" move (so timings are exact), and an NVML (``pynvml``) whose
clocks, temperature and throttle reasons follow a script, one step per reading."""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import pytest

GPU_UUID = "GPU-12345678-aaaa-bbbb-cccc-1234567890ab"


class VirtualTime:
    """A GPU clock that moves only when a fake kernel runs."""

    def __init__(self) -> None:
        self.ns = 1_000_000

    def advance_ms(self, ms: float) -> None:
        self.ns += int(ms * 1e6)

    def kernel(self, ms: float) -> Callable[..., None]:
        def run(*_args: Any) -> None:
            self.advance_ms(ms)

        return run


def fake_torch(clock: VirtualTime) -> SimpleNamespace:
    class Event:
        def __init__(self, enable_timing: bool = False) -> None:
            self.at = 0

        def record(self) -> None:
            self.at = clock.ns

        def elapsed_time(self, other: Event) -> float:
            return (other.at - self.at) / 1e6

    class Buffer:
        def zero_(self) -> None:
            clock.advance_ms(0.25)  # the L2 flush takes GPU time, outside the measured span

    class Tensor:  # never instantiated: only isinstance checks see it
        pass

    cuda = SimpleNamespace(
        is_initialized=lambda: True,
        current_device=lambda: 0,
        get_device_properties=lambda device: SimpleNamespace(L2_cache_size=50 * 1024**2),
        synchronize=lambda: None,
        Event=Event,
    )
    return SimpleNamespace(
        cuda=cuda, uint8="uint8", empty=lambda size, dtype, device: Buffer(), Tensor=Tensor
    )


def install_gpu(monkeypatch: pytest.MonkeyPatch, clock: VirtualTime) -> None:
    """A GPU worker without CUPTI: CUDA events on ``clock``, the worker's GPU named by UUID."""
    import sys

    monkeypatch.setitem(sys.modules, "torch", fake_torch(clock))
    monkeypatch.setitem(sys.modules, "cupti", None)
    monkeypatch.setitem(sys.modules, "cupti.cupti", None)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", GPU_UUID)


class FakeNvml:
    """``pynvml`` with one GPU, ``GPU_UUID``; each ``sample`` (one clock reading) takes the
    next step of ``sm_clocks`` and ``throttle`` (repeating the last)."""

    def __init__(
        self,
        sm_clocks: list[int] | None = None,
        throttle: list[int] | None = None,
        application_clock: int = 1980,
        default_application_clock: int = 1980,
    ) -> None:
        self.sm_clocks = sm_clocks or [1980]
        self.throttle = throttle or [0]
        self.application_clock = application_clock
        self.default_application_clock = default_application_clock
        self.opened: list[str] = []
        self.readings = 0
        self.shut_down = False

    @staticmethod
    def _at(values: list[int], index: int) -> int:
        return values[min(max(index, 0), len(values) - 1)]

    # the pynvml functions the probe calls
    def nvmlInit(self) -> None:
        pass

    def nvmlShutdown(self) -> None:
        self.shut_down = True

    def nvmlDeviceGetHandleByUUID(self, uuid: str) -> str:
        if uuid != GPU_UUID:
            raise RuntimeError(f"NVML_ERROR_NOT_FOUND {uuid}")
        self.opened.append(uuid)
        return "handle"

    def nvmlDeviceGetName(self, handle: str) -> str:
        return "NVIDIA H200"

    def nvmlDeviceGetApplicationsClock(self, handle: str, kind: int) -> int:
        return self.application_clock

    def nvmlDeviceGetDefaultApplicationsClock(self, handle: str, kind: int) -> int:
        return self.default_application_clock

    def nvmlDeviceGetClockInfo(self, handle: str, kind: int) -> int:
        if kind == 1:  # SM: the first reading of a sample
            return self._at(self.sm_clocks, self.readings - 1)  # after the reasons
        return 2619

    def nvmlDeviceGetTemperature(self, handle: str, kind: int) -> int:
        return 45

    def nvmlDeviceGetPowerUsage(self, handle: str) -> int:
        return 250_000

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: str) -> int:
        bits = self._at(self.throttle, self.readings)
        self.readings += 1  # the reasons are read first in every sample; then the clocks
        return bits


def install_nvml(monkeypatch: pytest.MonkeyPatch, nvml: FakeNvml) -> FakeNvml:
    import sys

    monkeypatch.setitem(sys.modules, "pynvml", nvml)
    return nvml
