"""Optional pieces of a server's workers, as ``GET /v1/info`` reports them (EXTENSIONS §1).

The README's install runs every worker; the ``kcoral[gpu]`` extra adds library uploads
(``apache-tvm-ffi``) and, on GPU workers, CUPTI (``cupti-python``: the cpu_only watch and
the benchmark's CUPTI clock). Workers report what they have in ``versions`` (``tvm_ffi``,
``cupti``); this turns that into the ``optional`` map, without importing anything.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

GPU_EXTRA = "pip install 'kcoral[gpu]'"

_MISSING = {
    "library-upload": (
        f"apache-tvm-ffi is not installed in the workers ({GPU_EXTRA}); "
        "library uploads fail with unavailable"
    ),
    "cupti": (
        f"cupti-python is not installed in the GPU workers ({GPU_EXTRA}); cpu_only runs fail "
        "with unavailable and kcoral.builtins.benchmark times with CUDA events"
    ),
}


def optional_pieces(device: str, versions: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """``{name: {"available": bool, "reason": str | None}}`` for ``device`` (``cpu``/``gpu``)."""
    present = {"library-upload": "tvm_ffi" in versions}
    if device == "gpu":
        present["cupti"] = "cupti" in versions
    return {
        name: {"available": found, "reason": None if found else _MISSING[name]}
        for name, found in present.items()
    }
