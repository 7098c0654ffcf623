"""Programs and small helpers shared by the job tests."""

from __future__ import annotations

import os
import re
import threading
import urllib.request
from typing import Any

from waiting import wait_for

import kcoral


def module_program(source: str, name: str, *args: Any, returns: bool = True) -> kcoral.Program:
    """A program that uploads ``source``, runs ``name(*args)`` and returns its value."""
    program = kcoral.Program()
    module = program.upload(kind="module", source=source, id="m")
    function = program.get_function(module=module, name=name, id="fn")
    value = program.run(fn=function, args=list(args), id="r")
    if returns:
        program.return_(key="r", value=value)
    return program


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def wait_until_it_waits_for_the_gpu(job: kcoral.Job, whose: str) -> None:
    """Follow ``job``'s event stream in a thread until its ``lease_wait`` phase."""
    phases: list[str] = []

    def follow() -> None:
        phases.extend(e.data["phase"] for e in job.events() if e.kind == "phase")

    threading.Thread(target=follow, daemon=True).start()
    wait_for(lambda: "lease_wait" in phases, f"{whose} job waiting for the GPU", 60.0)


def counts_by_gpu(url: str, histogram: str) -> dict[str, float]:
    """``gpu`` label -> the ``_count`` of ``histogram`` that ``GET /metrics`` of ``url``
    says."""
    with urllib.request.urlopen(url + "/metrics") as answer:
        text = answer.read().decode()
    pattern = rf'^{histogram}_count\{{gpu="([^"]+)"\}} (\S+)$'
    return {gpu: float(value) for gpu, value in re.findall(pattern, text, re.MULTILINE)}
