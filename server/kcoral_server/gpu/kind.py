"""What kind of node this is (ROUTER §6): its GPUs' product as a short key, arch, memory and
count, or ``cpu``.

The product name comes from NVML (``pynvml``, the optional ``gpu`` extra) or else
``nvidia-smi``; the front-end never imports torch. ``gpu_key`` turns a product name into the
short key a fleet is sorted by ("NVIDIA H100 80GB HBM3" -> ``h100``): vendor and family words,
memory sizes, form factors and MIG profiles go, the model stays.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from kcoral_server.gpu.device_nodes import nvml_session, nvml_text, smi_output
from kcoral_server.pool.seat import GpuDevice

CPU_KIND = "cpu"
FAKE_KIND = "fake"  # the test-only fake-GPU runtime
UNKNOWN_KIND = "unknown"  # a GPU whose product no source names
MAX_KEY_LENGTH = 32
SMI_QUERY = ("--query-gpu=uuid,index,name,memory.total", "--format=csv,noheader,nounits")

# Words that name the vendor, a product line or a generation rather than the model.
_DROPPED_WORDS = frozenset(
    {"nvidia", "tesla", "geforce", "quadro", "generation", "gpu", "graphics", "device"}
)
# Memory sizes and form factors: one model in several packages is one kind.
_DROPPED_TOKEN = re.compile(r"^(?:\d+gb|sxm\d*|pcie|pci|e|nvl|hbm\d*e?|\d+w)$")


def gpu_key(product: str) -> str:
    """The short key of a GPU product name: ``[a-z0-9]``, at most 32 characters;
    ``unknown`` when nothing of a model is left."""
    text = product.strip().lower()
    text = re.split(r"\bmig\b", text, maxsplit=1)[0]  # "... MIG 1g.10gb": a slice of the GPU
    tokens = [t for t in re.split(r"[\s\-_/]+", text) if t]
    kept = [t for t in tokens if t not in _DROPPED_WORDS and not _DROPPED_TOKEN.match(t)]
    key = re.sub(r"[^a-z0-9]", "", "".join(kept))[:MAX_KEY_LENGTH]
    return key or UNKNOWN_KIND


@dataclass(frozen=True)
class NodeKind:
    """What a node offers: ``gpu`` (the short key, ``cpu`` without GPUs), ``arch``
    (``sm_90a``; ``""`` on a CPU node), ``memory_bytes`` (the smallest GPU's, 0 when
    unknown), ``gpus`` (count) and ``product`` (the name the driver gives, ``""`` if none)."""

    gpu: str
    arch: str = ""
    memory_bytes: int = 0
    gpus: int = 0
    product: str = ""

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


def cpu_kind() -> NodeKind:
    return NodeKind(CPU_KIND)


def describe_node(
    mode: str, gpus: Sequence[GpuDevice], products: dict[str, tuple[str, int]] | None = None
) -> NodeKind:
    """The kind of a server of device ``mode`` (``cpu``, ``gpu``, ``fake-gpu``) over ``gpus``.

    ``products`` maps a GPU's UUID or index (as text) to its product name and memory bytes
    (``probe_products``; probed here when None and the mode is ``gpu``). GPUs of one server
    share one arch (``inventory``); where their products differ, the first GPU's names the
    kind and the smallest memory counts."""
    if mode == "cpu" or not gpus:
        return cpu_kind()
    arch = gpus[0].arch
    if mode != "gpu":
        return NodeKind(FAKE_KIND, arch, 0, len(gpus))
    found = probe_products() if products is None else products
    named = [found.get(g.uuid) or found.get(str(g.id)) for g in gpus]
    known = [n for n in named if n is not None]
    if not known:
        return NodeKind(UNKNOWN_KIND, arch, 0, len(gpus))
    product = known[0][0]
    return NodeKind(gpu_key(product), arch, min(m for _, m in known), len(gpus), product)


def probe_products() -> dict[str, tuple[str, int]]:
    """Every GPU's ``(product name, memory bytes)`` by UUID and by index (NVML, else
    ``nvidia-smi``); empty when neither answers."""
    found = _nvml_products()
    return found if found else _smi_products()


def _nvml_products() -> dict[str, tuple[str, int]]:
    found: dict[str, tuple[str, int]] = {}
    with nvml_session() as pynvml:
        if pynvml is None:
            return {}
        try:
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                name = nvml_text(pynvml.nvmlDeviceGetName(handle))
                uuid = nvml_text(pynvml.nvmlDeviceGetUUID(handle))
                memory = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
                found[uuid] = found[str(index)] = (name, memory)
        except Exception:
            return {}
    return found


def _smi_products() -> dict[str, tuple[str, int]]:
    output = smi_output(SMI_QUERY)
    return {} if output is None else parse_smi_products(output)


def parse_smi_products(text: str) -> dict[str, tuple[str, int]]:
    """``nvidia-smi --query-gpu=uuid,index,name,memory.total`` (csv, no units) -> products."""
    found: dict[str, tuple[str, int]] = {}
    for line in text.splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 4:
            continue
        uuid, index, name, mebibytes = parts
        try:
            memory = int(float(mebibytes)) * 1024 * 1024
        except ValueError:
            memory = 0
        found[uuid] = found[index] = (name, memory)
    return found
