"""Which GPUs does this machine have? (EXTENSIONS §2 ``--device auto``.)

The probe runs in a short-lived subprocess: the front-end itself never imports torch and never
creates a CUDA context (forking workers after CUDA initialization is unsafe).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kcoral_server.pool.seat import GpuDevice

PROBE_TIMEOUT_SECONDS = 60.0

_PROBE = r"""
import json
try:
    import torch
except Exception as exc:
    print(json.dumps({"devices": [], "problem": f"torch cannot be imported: {exc}"}))
    raise SystemExit(0)
devices = []
if torch.cuda.is_available():
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        uuid = str(getattr(p, "uuid", "") or "")
        if uuid and not uuid.startswith("GPU-"):
            uuid = "GPU-" + uuid
        devices.append({"index": i, "uuid": uuid, "major": p.major, "minor": p.minor})
print(json.dumps({"devices": devices}))
"""


class DeviceError(Exception):
    """The requested GPUs are not usable (missing, or of mixed architectures)."""


@dataclass(frozen=True)
class DeviceChoice:
    mode: str  # "cpu", "gpu" or "fake-gpu"
    gpus: list[GpuDevice]
    #: why ``--device auto`` chose the CPU without knowing whether there is a GPU (the
    #: probe failed), else ""
    probe_problem: str = ""


def arch_name(major: int, minor: int) -> str:
    """``sm_{major}{minor}`` plus ``a`` when major >= 9 (PROTOCOL §12)."""
    return f"sm_{major}{minor}" + ("a" if major >= 9 else "")


def probe_gpus(environ: Mapping[str, str] | None = None, *, physical: bool = False) -> list[dict]:
    """Visible CUDA devices as ``{"index", "uuid", "major", "minor"}`` (empty without CUDA).

    ``physical`` drops ``CUDA_VISIBLE_DEVICES`` so indices are physical ids."""
    return _probe(environ, physical=physical)[0]


def _probe(environ: Mapping[str, str] | None, *, physical: bool) -> tuple[list[dict], str]:
    """``probe_gpus``'s devices, and why the probe could not say ("" when it could): an
    empty list is "no GPU" only then."""
    env = dict(os.environ if environ is None else environ)
    if physical:
        env.pop("CUDA_VISIBLE_DEVICES", None)
    try:
        done = subprocess.run(
            [sys.executable, "-c", _PROBE],
            env=env,
            capture_output=True,
            text=True,
            timeout=PROBE_TIMEOUT_SECONDS,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return [], f"it did not answer within {PROBE_TIMEOUT_SECONDS:g} s"
    except (OSError, subprocess.SubprocessError) as exc:
        return [], str(exc)
    try:
        answer = json.loads(done.stdout.strip().splitlines()[-1])
        return list(answer["devices"]), str(answer.get("problem") or "")
    except (ValueError, KeyError, IndexError, TypeError):
        last = (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]
        return [], last[:300]


def choose_devices(
    device: str,
    gpus: Sequence[int],
    *,
    gpus_given: bool,
    fake_gpu_count: int = 0,
    environ: Mapping[str, str] | None = None,
) -> DeviceChoice:
    """Resolve ``--device`` (``auto``/``gpu``/``cpu``/``fake-gpu``) to a mode and GPU list."""
    if device == "fake-gpu" or fake_gpu_count:
        count = fake_gpu_count or len(gpus)
        ids = list(gpus)[:count] if gpus_given and len(gpus) >= count else list(range(count))
        return DeviceChoice("fake-gpu", [GpuDevice(i, "", "sm_90a") for i in ids])
    if device == "cpu":
        return DeviceChoice("cpu", [])
    if device == "auto":
        visible, problem = _probe(environ, physical=False)
        if not visible:
            return DeviceChoice("cpu", [], probe_problem=problem)
        if not gpus_given:
            found = _describe(visible)
            _check_one_arch(found)
            return DeviceChoice("gpu", found)
    devices, problem = _probe(environ, physical=True)
    physical = {d["index"]: d for d in devices}
    missing = [g for g in gpus if g not in physical]
    if missing:
        if not physical and problem:  # not "no GPU": nobody could tell
            raise DeviceError(f"--device gpu: the GPU probe failed: {problem}")
        # say what to pass instead: a first start with --device gpu on a machine without
        # one read only "GPU ids [0] are not available on this machine"
        if not physical:
            raise DeviceError(
                "--device gpu: CUDA finds no GPU on this machine (--device cpu, or the "
                "default auto, runs programs on the CPU)"
            )
        present = ", ".join(str(index) for index in sorted(physical))
        raise DeviceError(
            f"GPU ids {missing} are not available on this machine (its GPUs: {present}; "
            "--gpus picks among them)"
        )
    chosen = _describe([physical[g] for g in dict.fromkeys(gpus)])
    _check_one_arch(chosen)
    return DeviceChoice("gpu", chosen)


def _describe(devices: list[dict]) -> list[GpuDevice]:
    return [
        GpuDevice(int(d["index"]), str(d.get("uuid") or ""), arch_name(d["major"], d["minor"]))
        for d in devices
    ]


def _check_one_arch(gpus: list[GpuDevice]) -> None:
    arches = sorted({g.arch for g in gpus})
    if len(arches) > 1:
        raise DeviceError(f"GPUs of one server must share one architecture, got {arches}")
