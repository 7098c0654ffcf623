"""``kcoral run``'s one line while its job waits its turn for the GPU lease, after a worker
took it (EXTENSIONS §7). The queue notices end once a worker takes the job; a job whose
worker then waits for a GPU another program holds (or, with ``--gpus 2``, for a whole set)
printed nothing for as long as that program ran, and looked hung."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from typing import Any

#: How long a lease wait lasts before it is said (most last milliseconds).
GPU_WAIT_NOTICE_SECONDS = 1.0


def gpu_wait_notice(gpu_count: int | None) -> str:
    """The line: true whether the GPUs are held or only promised to a program ahead."""
    if gpu_count is None or gpu_count == 1:
        return "waiting its turn for the GPU; the tool starts when it is free"
    return f"waiting its turn for {gpu_count} GPUs; the tool starts when they are free"


class GpuWaitNotice:
    """Says ``gpu_wait_notice`` once, when a lease wait before the tool starts lasts
    ``GPU_WAIT_NOTICE_SECONDS``; ``seen`` takes each of the job's phases."""

    def __init__(self, gpu_count: int | None, say: Callable[[str], None]) -> None:
        self._line = gpu_wait_notice(gpu_count)
        self._say = say
        self._timer: threading.Timer | None = None
        self._done = False  # said, or the tool started: never said again
        self._lock = threading.Lock()

    def seen(self, phase: Mapping[str, Any]) -> None:
        name = phase.get("phase")
        if name == "lease_wait":
            if not self._done and self._timer is None:
                self._timer = threading.Timer(GPU_WAIT_NOTICE_SECONDS, self._say_once)
                self._timer.daemon = True
                self._timer.start()
            return
        self.cancel()
        if name == "instruction" and phase.get("op") == "run":
            self._done = True  # the tool runs: a later wait is no wait for it to start

    def cancel(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _say_once(self) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        self._say(self._line)
