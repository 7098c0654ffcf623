"""The cpu_only watch: a no-op off the GPU, ``unavailable`` without cupti-python, and the
``gpu_access`` failure driven through a stand-in for ``cupti.cupti`` (no GPU here)."""

from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
from kcoral_server.worker import cupti_guard
from kcoral_server.worker.cupti_guard import (
    MISSING_CUPTI,
    UNKNOWN_CALL_SITE,
    GpuAccessFailure,
    call_site,
    finalize_cupti,
    watch_cpu_only,
)
from kcoral_server.worker.failures import InstructionFailure

UPLOADED = "<uploaded:0123456789abcdef>"


class FakeCupti:
    """Calls the subscriber's callback like CUPTI does on every API entry and exit."""

    CallbackDomain = SimpleNamespace(RUNTIME_API=1, DRIVER_API=2)
    ApiCallbackSite = SimpleNamespace(API_ENTER=0, API_EXIT=1)

    def __init__(self) -> None:
        self.callback = None
        self.domains: set[int] = set()
        self.subscribed = 0
        self.finalized = 0

    def subscribe(self, callback, userdata) -> int:
        assert self.callback is None, "CUPTI allows one subscriber"
        self.callback = callback
        self.subscribed += 1
        return 7

    def enable_domain(self, enable: int, subscriber: int, domain: int) -> None:
        assert (enable, subscriber) == (1, 7)
        self.domains.add(domain)

    def unsubscribe(self, subscriber: int) -> None:
        assert subscriber == 7
        self.callback = None
        self.domains.clear()

    def get_callback_name(self, domain: int, cbid: int) -> str:
        return "cuMemAlloc_v2"

    def finalize(self) -> None:
        self.finalized += 1

    def api(self, name: str, domain: int = 1) -> None:
        """A CUDA API call: enter and exit callbacks when someone listens."""
        if self.callback is None or domain not in self.domains:
            return
        for site in (0, 1):
            self.callback(None, domain, 42, SimpleNamespace(callback_site=site, function_name=name))


@pytest.fixture
def cupti(monkeypatch) -> FakeCupti:
    fake = FakeCupti()
    monkeypatch.setitem(sys.modules, "cupti", SimpleNamespace(cupti=fake))
    monkeypatch.setitem(sys.modules, "cupti.cupti", fake)
    return fake


def uploaded_function(source: str, name: str, **namespace):
    """A function whose frames carry an ``<uploaded:…>`` file name, as the engine makes them."""
    exec(compile(source, UPLOADED, "exec"), namespace)
    return namespace[name]


TOUCH_GPU = """
def touch_gpu(cupti):
    cupti.api("cudaMalloc_v3020")
    cupti.api("cuMemAlloc_v2", 2)
    return "done"
"""


def test_the_watch_is_a_no_op_on_a_cpu_worker(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "cupti.cupti", None)  # not even looked for
    with watch_cpu_only("cpu") as watch:
        assert not watch.active
    with pytest.raises(ZeroDivisionError), watch_cpu_only("fake-gpu"):
        1 / 0  # noqa: B018


def test_a_gpu_worker_without_cupti_python_is_unavailable(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "cupti", None)
    monkeypatch.setitem(sys.modules, "cupti.cupti", None)
    ran = []
    with pytest.raises(InstructionFailure) as info, watch_cpu_only("gpu"):
        ran.append(True)
    assert info.value.kind == "unavailable"
    assert info.value.message == MISSING_CUPTI
    assert "cupti-python" in MISSING_CUPTI
    assert ran == []  # the function never ran unwatched


def test_a_cuda_call_in_a_cpu_only_function_fails_it_with_gpu_access(cupti: FakeCupti) -> None:
    touch_gpu = uploaded_function(TOUCH_GPU, "touch_gpu")
    with pytest.raises(GpuAccessFailure) as info, watch_cpu_only("gpu"):
        assert touch_gpu(cupti) == "done"  # CUPTI cannot stop the call; the run fails after
    failure = info.value
    assert failure.kind == "gpu_access"
    assert failure.fields == {
        "cuda_call": "cudaMalloc",
        "location": f"{UPLOADED}:3 in touch_gpu",
        "interfered_request_id": None,
    }
    assert failure.message == f"cpu_only function called cudaMalloc at {UPLOADED}:3 in touch_gpu"
    assert failure.traceback.startswith("Traceback (most recent call last):\n")
    assert f'File "{UPLOADED}", line 3, in touch_gpu' in failure.traceback
    assert failure.traceback.endswith("CUDA API entered: cudaMalloc\n")
    assert isinstance(failure.observed_at, float)
    assert cupti.callback is None  # unsubscribed again


def test_the_first_cuda_entry_wins_over_a_later_exception(cupti: FakeCupti) -> None:
    source = "def f(cupti):\n    cupti.api('cuLaunchKernel', 2)\n    raise ValueError('later')\n"
    f = uploaded_function(source, "f")
    with pytest.raises(GpuAccessFailure) as info, watch_cpu_only("gpu"):
        f(cupti)
    assert info.value.fields["cuda_call"] == "cuLaunchKernel"


def test_a_cpu_only_function_that_stays_off_the_gpu_runs_normally(cupti: FakeCupti) -> None:
    with watch_cpu_only("gpu") as watch:
        assert watch.active
        assert cupti.domains == {1, 2}
        total = sum(range(10))
    assert total == 45
    assert cupti.callback is None
    cupti.api("cudaFree")  # after the run nothing is watched any more


def test_an_exception_of_a_clean_cpu_only_function_passes_through(cupti: FakeCupti) -> None:
    with pytest.raises(KeyError), watch_cpu_only("gpu"):
        raise KeyError("x")


def test_the_location_falls_back_to_the_innermost_frame_outside_the_server(
    cupti: FakeCupti,
) -> None:
    def plain_helper() -> None:
        # a native caller: ``map`` invokes the callback with no Python frame in between,
        # as the CUDA library does
        enter = SimpleNamespace(callback_site=0, function_name="cudaMalloc_v3020")
        list(map(cupti.callback, [None], [1], [42], [enter]))

    with pytest.raises(GpuAccessFailure) as info, watch_cpu_only("gpu"):
        plain_helper()
    location = info.value.fields["location"]
    assert location.startswith(__file__ + ":")
    assert location.endswith(" in plain_helper")


def test_a_call_with_no_known_frame_has_an_unknown_call_site() -> None:
    assert call_site(None) == UNKNOWN_CALL_SITE


def test_a_nameless_callback_uses_cuptis_callback_name(cupti: FakeCupti) -> None:
    with pytest.raises(GpuAccessFailure) as info, watch_cpu_only("gpu"):
        cupti.api("")
    assert info.value.fields["cuda_call"] == "cuMemAlloc_v2"


def test_a_cupti_that_refuses_a_subscriber_is_unavailable(cupti: FakeCupti) -> None:
    def refuse(callback, userdata):
        raise RuntimeError("CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED")

    cupti.subscribe = refuse
    with pytest.raises(InstructionFailure) as info, watch_cpu_only("gpu"):
        pass
    assert info.value.kind == "unavailable"
    assert "MULTIPLE_SUBSCRIBERS" in info.value.message


def test_finalize_detaches_cupti_only_when_it_was_imported(cupti: FakeCupti, monkeypatch) -> None:
    finalize_cupti()
    assert cupti.finalized == 1
    monkeypatch.delitem(sys.modules, "cupti.cupti")
    finalize_cupti()  # nothing to do, nothing imported
    assert "cupti.cupti" not in sys.modules


def test_the_missing_reason_names_cupti_python_without_importing_it(monkeypatch) -> None:
    monkeypatch.setattr(cupti_guard.importlib.util, "find_spec", lambda name: None)
    assert cupti_guard.cupti_missing_reason() == MISSING_CUPTI


def test_torch_bookkeeping_in_a_cpu_only_function_passes_the_watch(cupti: FakeCupti) -> None:
    with watch_cpu_only("gpu") as watch:
        cupti.api("cudaGetDeviceCount_v3020")
        cupti.api("cuDevicePrimaryCtxGetState", 2)
        # an allowed runtime call and the driver call the runtime makes inside it
        enter = SimpleNamespace(callback_site=0, function_name="cudaDeviceSynchronize_v3020")
        inner = SimpleNamespace(callback_site=0, function_name="cuCtxSynchronize")
        cupti.callback(None, 1, 1, enter)
        cupti.callback(None, 2, 2, inner)
        cupti.callback(None, 2, 2, SimpleNamespace(callback_site=1, function_name=""))
        cupti.callback(None, 1, 1, SimpleNamespace(callback_site=1, function_name=""))
        assert watch.active
    with pytest.raises(GpuAccessFailure) as info, watch_cpu_only("gpu"):
        cupti.api("cudaGetDevice_v3020")
        cupti.api("cudaLaunchKernel_v7000")
    assert info.value.fields["cuda_call"] == "cudaLaunchKernel"
