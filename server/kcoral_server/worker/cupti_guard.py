"""The ``cpu_only`` watch: a CUDA API call made by a cpu_only run fails it (PROTOCOL §6.2).

On a GPU worker the engine drains and releases the lease before a ``run`` whose function
was selected with ``cpu_only: true``, so another request may be using the GPU meanwhile.
While such a call runs, a CUPTI callback subscriber watches the CUDA runtime and driver
APIs; the first entry fails the instruction with kind ``gpu_access`` and the fields of
PROTOCOL §7.6 (``cuda_call``, ``location``, ``interfered_request_id``). CUPTI cannot stop
the call itself, so the failure is raised when the watched call returns.

The worker cannot know who holds the lease it gave back, so the failure carries
``observed_at`` (``time.monotonic()``, the same clock the front-end's lease history uses)
and ``interfered_request_id`` stays ``None`` until the front-end fills it in.

Not every CUDA API entry is GPU work. Torch's own bookkeeping asks the runtime questions
that create no work, allocate no device memory and launch nothing: a CPU backward pass
starts autograd's device threads (``cudaGetDeviceCount``, ``cudaGetDevice``,
``cuDevicePrimaryCtxGetState``), ``torch.profiler`` reads device properties and versions
when it attaches CUPTI and synchronizes when it stops. ``ALLOWED_CALLS`` names those calls
(PROTOCOL §6.2, implementation note); driver calls made *inside* an allowed runtime call
(the runtime asks the driver) are allowed with it. ``CallJudge`` is that decision, free of
CUPTI, so recorded call sequences test it.

On CPU (and fake-GPU) workers the watch is a no-op. On a GPU worker without
``cupti-python``, or whose CUPTI library fails to load, the run fails with ``unavailable``,
naming the missing piece and how to install it.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import os
import re
import sys
import threading
import time
import traceback
from types import FrameType, TracebackType
from typing import Any

from kcoral_server.worker.failures import InstructionFailure, exception_text

MISSING_CUPTI = (
    "cpu_only runs need CUPTI support (cupti-python, module 'cupti'), "
    "which this worker cannot import: pip install 'kcoral[gpu]'"
)
UNKNOWN_CALL_SITE = "an unknown call site"

# Frames of the server package are never the culprit's location.
_SERVER_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_WORKER_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_ASYNCIO_DIR = os.path.abspath(asyncio.__path__[0]) + os.sep
_RUNTIME_VERSION_SUFFIX = re.compile(r"^(cuda\w+?)_v\d{4,5}$")
# CUPTI and the headers name variants: cudaX_v3020, cuX_v2, cuX_ptsz / _ptds (per-thread
# default stream); the judge compares base names.
_VARIANT_SUFFIX = re.compile(r"(_v\d+|_ptsz|_ptds)+$")

# CUDA runtime and driver calls that create no GPU work, allocate no device memory and
# launch nothing: queries, the current-device and current-context bookkeeping, error
# reads, entry-point lookups and waits on this process's own (already drained) work.
# PROTOCOL §6.2 implementation note lists the same names.
ALLOWED_CALLS = frozenset(
    {
        # runtime: devices, versions, properties
        "cudaGetDeviceCount",
        "cudaGetDevice",
        "cudaSetDevice",
        "cudaGetDeviceProperties",
        "cudaDeviceGetAttribute",
        "cudaDeviceGetPCIBusId",
        "cudaDeviceGetStreamPriorityRange",
        "cudaDeviceCanAccessPeer",
        "cudaDriverGetVersion",
        "cudaRuntimeGetVersion",
        "cudaMemGetInfo",
        "cudaPointerGetAttributes",
        # runtime: errors, entry points, capture state
        "cudaGetLastError",
        "cudaPeekAtLastError",
        "cudaGetDriverEntryPoint",
        "cudaGetDriverEntryPointByVersion",
        "cudaStreamIsCapturing",
        "cudaStreamGetCaptureInfo",
        "cudaThreadExchangeStreamCaptureMode",
        # runtime: waits and polls on this process's own streams and events
        "cudaDeviceSynchronize",
        "cudaStreamSynchronize",
        "cudaStreamQuery",
        "cudaEventSynchronize",
        "cudaEventQuery",
        # driver: initialization (idempotent once the worker started), devices, versions
        "cuInit",
        "cuDriverGetVersion",
        "cuDeviceGet",
        "cuDeviceGetCount",
        "cuDeviceGetName",
        "cuDeviceGetUuid",
        "cuDeviceGetAttribute",
        "cuDeviceGetPCIBusId",
        "cuDeviceTotalMem",
        "cuDeviceCanAccessPeer",
        "cuDevicePrimaryCtxGetState",
        "cuMemGetInfo",
        "cuPointerGetAttribute",
        "cuPointerGetAttributes",
        # driver: current-context bookkeeping, errors, entry points
        "cuCtxGetCurrent",
        "cuCtxSetCurrent",
        "cuCtxGetDevice",
        "cuCtxGetApiVersion",
        "cuCtxGetFlags",
        "cuCtxSynchronize",
        "cuGetErrorName",
        "cuGetErrorString",
        "cuGetProcAddress",
        "cuGetExportTable",
        "cuStreamSynchronize",
        "cuStreamQuery",
        "cuEventSynchronize",
        "cuEventQuery",
    }
)


def base_name(name: str) -> str:
    """``cudaGetDeviceCount_v3020`` → ``cudaGetDeviceCount``; ``cuMemAlloc_v2`` → ``cuMemAlloc``."""
    return _VARIANT_SUFFIX.sub("", name)


def is_allowed_call(name: str) -> bool:
    """May a cpu_only call make this CUDA API call (it creates no GPU work)?"""
    return base_name(name) in ALLOWED_CALLS


class CallJudge:
    """Finds the first CUDA API entry that counts as GPU work in a stream of callbacks.

    ``enter``/``exit`` take the call's name and the calling thread. An allowed call opens a
    span on its thread inside which every entry (the driver calls the runtime makes for it)
    is allowed too; the first entry outside such a span that is not allowed is returned by
    ``enter`` (and every later one as well: the caller keeps the first).
    """

    def __init__(self) -> None:
        self._depth: dict[int, int] = {}

    def enter(self, name: str, thread: int) -> bool:
        """True when this entry is GPU work (a violation of the cpu_only watch)."""
        depth = self._depth.get(thread, 0)
        if depth or is_allowed_call(name):
            self._depth[thread] = depth + 1
            return False
        return True

    def exit(self, thread: int) -> None:
        depth = self._depth.get(thread, 0)
        if depth > 1:
            self._depth[thread] = depth - 1
        else:
            self._depth.pop(thread, None)  # also an exit whose entry the watch never saw


def first_violation(calls: list[tuple[str, str] | tuple[str, str, int]]) -> str | None:
    """The first call that counts as GPU work in ``(site, name[, thread])`` records, site
    ``"enter"`` or ``"exit"``; ``None`` when the sequence is honest (tests, reports)."""
    judge = CallJudge()
    for record in calls:
        site, name = record[0], record[1]
        thread = record[2] if len(record) > 2 else 0
        if site == "enter":
            if judge.enter(name, thread):
                return base_name(name)
        else:
            judge.exit(thread)
    return None


class GpuAccessFailure(InstructionFailure):
    """A ``gpu_access`` failure; ``fields`` are the three extra error fields of §7.6."""

    def __init__(self, cuda_call: str, location: str, traceback_text: str, observed_at: float):
        super().__init__(
            "gpu_access", f"cpu_only function called {cuda_call} at {location}", traceback_text
        )
        self.fields: dict[str, Any] = {
            "cuda_call": cuda_call,
            "location": location,
            "interfered_request_id": None,
        }
        self.observed_at = observed_at


class CpuOnlyWatch:
    """Context manager around one cpu_only call; see the module docstring."""

    def __init__(self, device: str) -> None:
        self.device = device
        self._cupti: Any = None
        self._subscriber: Any = None
        self._lock = threading.Lock()
        self._violation: GpuAccessFailure | None = None
        self._judge = CallJudge()

    @property
    def active(self) -> bool:
        return self._subscriber is not None

    def __enter__(self) -> CpuOnlyWatch:
        if self.device != "gpu":
            return self  # CPU server: the watch is a no-op (PROTOCOL §6.2)
        cupti = load_cupti()
        try:
            subscriber = cupti.subscribe(self._callback, None)
        except Exception as exc:
            raise InstructionFailure(
                "unavailable", f"the cpu_only watch could not start CUPTI: {exception_text(exc)}"
            ) from None
        self._cupti, self._subscriber = cupti, subscriber
        try:
            for name in ("RUNTIME_API", "DRIVER_API"):
                cupti.enable_domain(1, subscriber, getattr(cupti.CallbackDomain, name))
        except Exception as exc:
            self._stop()
            raise InstructionFailure(
                "unavailable", f"the cpu_only watch could not start CUPTI: {exception_text(exc)}"
            ) from None
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop()
        violation = self._violation
        if violation is not None and (exc_type is None or issubclass(exc_type, Exception)):
            # the first CUDA entry decides the outcome, whatever the call did afterwards
            raise violation from None

    def _stop(self) -> None:
        subscriber, self._subscriber = self._subscriber, None
        if subscriber is None:
            return
        try:
            self._cupti.unsubscribe(subscriber)
        except Exception:
            pass  # nothing useful to report; teardown finalizes CUPTI anyway

    def _callback(self, userdata: Any, domain: Any, cbid: Any, cbdata: Any) -> None:
        if self._violation is not None:
            return
        try:
            entering = int(getattr(cbdata, "callback_site", 0)) == int(
                self._cupti.ApiCallbackSite.API_ENTER
            )
        except Exception:
            return
        observed_at = time.monotonic()
        thread = threading.get_ident()
        with self._lock:
            if self._violation is not None:
                return
            if not entering:
                self._judge.exit(thread)
                return
            name = _call_name(self._cupti, domain, cbid, cbdata)
            if not self._judge.enter(name, thread):
                return  # bookkeeping that creates no GPU work (ALLOWED_CALLS)
            frame = sys._getframe(1)
            self._violation = GpuAccessFailure(
                name, call_site(frame), stack_text(frame, name), observed_at
            )


def watch_cpu_only(device: str) -> CpuOnlyWatch:
    """The watch for one cpu_only ``run`` on a worker of ``device`` (``gpu``, ``cpu``, …)."""
    return CpuOnlyWatch(device)


def load_cupti() -> Any:
    """``cupti.cupti``, or an ``unavailable`` failure naming what is missing."""
    try:
        return importlib.import_module("cupti.cupti")
    except ImportError as exc:
        if exc.name not in ("cupti", "cupti.cupti"):  # installed, but a dependency is not
            raise InstructionFailure(
                "unavailable", f"CUPTI (cupti-python) failed to load: {exception_text(exc)}"
            ) from None
        raise InstructionFailure("unavailable", MISSING_CUPTI) from None
    except Exception as exc:  # the module exists but its native library does not load
        raise InstructionFailure(
            "unavailable", f"CUPTI (cupti-python) failed to load: {exception_text(exc)}"
        ) from None


def cupti_missing_reason() -> str | None:
    """Why a cpu_only run cannot be watched here, without importing anything."""
    if importlib.util.find_spec("cupti") is None:
        return MISSING_CUPTI
    return None


def finalize_cupti() -> None:
    """Detach CUPTI between reused requests (SERVER §6) if anything in this process used it
    (the cpu_only watch, ``kcoral.builtins.benchmark`` or uploaded code)."""
    module = sys.modules.get("cupti.cupti")
    if module is None:
        return
    try:
        module.finalize()
    except Exception:
        pass  # a worker whose CUPTI cannot detach still runs programs correctly


def _call_name(cupti: Any, domain: Any, cbid: Any, cbdata: Any) -> str:
    name = getattr(cbdata, "function_name", None) or ""
    if not name:
        try:
            name = str(cupti.get_callback_name(domain, cbid))
        except Exception:
            name = f"CUDA API call {int(cbid)}"
    match = _RUNTIME_VERSION_SUFFIX.match(name)  # CUPTI names runtime calls cudaX_v3020
    return match.group(1) if match else name


def _frames(frame: FrameType | None) -> list[traceback.FrameSummary]:
    return list(traceback.extract_stack(frame)) if frame is not None else []


def call_site(frame: FrameType | None) -> str:
    """``file:line in function`` of the innermost uploaded frame, else of the innermost
    frame outside the server package, else ``an unknown call site`` (§7.6)."""
    frames = _frames(frame)
    for summary in reversed(frames):
        if summary.filename.startswith("<uploaded:"):
            return _where(summary)
    for summary in reversed(frames):
        if not summary.filename.startswith(_SERVER_DIR):
            return _where(summary)
    return UNKNOWN_CALL_SITE


def _where(summary: traceback.FrameSummary) -> str:
    return f"{summary.filename}:{summary.lineno} in {summary.name}"


def stack_text(frame: FrameType | None, cuda_call: str) -> str:
    """The stack at the CUDA call, starting at the first frame that is not the worker's."""
    frames = _frames(frame)
    start = 0
    while start < len(frames) and frames[start].filename.startswith((_WORKER_DIR, _ASYNCIO_DIR)):
        start += 1
    body = "".join(traceback.format_list(frames[start:]))
    return f"Traceback (most recent call last):\n{body}CUDA API entered: {cuda_call}\n"
