"""Which ``/dev/nvidiaN`` belongs to a GPU, found by the GPU's identity (SERVER §14).

CUDA numbers devices fastest first unless ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, the driver
numbers its device files by its own minor numbers, and ``nvidia-smi`` by PCI order: the
three can differ. A worker's GPU is known by its UUID (``CUDA_VISIBLE_DEVICES`` of a GPU
worker lists UUIDs), so the sandbox binds the device file whose minor number the driver
gives that UUID:

1. ``/proc/driver/nvidia/gpus/<bus id>/information`` names each GPU's ``GPU UUID`` and
   ``Device Minor`` (the N of ``/dev/nvidiaN``) — preferred;
2. where that file lacks the UUID, NVML (``pynvml``, only when installed) or
   ``nvidia-smi --query-gpu=uuid,pci.bus_id,index`` maps the UUID to its PCI bus id, which
   names the ``/proc`` folder;
3. without ``/proc/driver/nvidia`` (some containers), NVML's minor number, else
   nvidia-smi's ``index``.

A GPU given by a bare CUDA index, or one no source knows, keeps the old guess
``/dev/nvidia<index>``. The table is read once per process.
"""

from __future__ import annotations

import contextlib
import functools
import re
import shutil
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROC_GPUS = Path("/proc/driver/nvidia/gpus")
SMI_QUERY = ("--query-gpu=uuid,pci.bus_id,index", "--format=csv,noheader")
SMI_TIMEOUT_SECONDS = 20.0

_BUS_ID = re.compile(
    r"^(?:(?P<domain>[0-9a-fA-F]{1,8}):)?(?P<bus>[0-9a-fA-F]{1,2}):"
    r"(?P<device>[0-9a-fA-F]{1,2})\.(?P<function>[0-7])$"
)


@dataclass(frozen=True)
class GpuRecord:
    """One GPU as the driver knows it."""

    uuid: str
    bus_id: str  # normalized: 0000:3b:00.0
    minor: int | None  # N of /dev/nvidiaN, when known


def normalize_bus_id(text: str) -> str | None:
    """``00000000:3B:00.0`` (nvidia-smi, NVML) and ``0000:3b:00.0`` (/proc) → ``0000:3b:00.0``."""
    match = _BUS_ID.match(text.strip())
    if match is None:
        return None
    domain = int(match["domain"] or "0", 16)
    bus, device, function = int(match["bus"], 16), int(match["device"], 16), match["function"]
    return f"{domain:04x}:{bus:02x}:{device:02x}.{function}"


def normalize_uuid(text: str) -> str:
    text = text.strip()
    return text if text.upper().startswith(("GPU-", "MIG-")) else f"GPU-{text}"


def parse_information(text: str) -> dict[str, str]:
    """``key: value`` lines of a ``/proc/driver/nvidia/gpus/*/information`` file."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields[key.strip()] = value.strip()
    return fields


def read_proc(root: Path = PROC_GPUS) -> dict[str, tuple[str | None, int]]:
    """``{bus id: (uuid or None, minor)}`` from the driver's ``/proc`` tree."""
    found: dict[str, tuple[str | None, int]] = {}
    try:
        folders = sorted(root.iterdir())
    except OSError:
        return found
    for folder in folders:
        try:
            fields = parse_information((folder / "information").read_text(errors="replace"))
        except OSError:
            continue
        bus = normalize_bus_id(fields.get("Bus Location", folder.name))
        minor = fields.get("Device Minor", "")
        if bus is None or not minor.isdigit():
            continue
        uuid = fields.get("GPU UUID") or None
        found[bus] = (normalize_uuid(uuid) if uuid else None, int(minor))
    return found


def parse_smi(text: str) -> list[tuple[str, str, int]]:
    """``(uuid, bus id, index)`` rows of ``nvidia-smi --query-gpu=uuid,pci.bus_id,index``."""
    rows = []
    for line in text.splitlines():
        parts = [part.strip() for part in line.split(",")]
        if len(parts) != 3 or not parts[2].isdigit():
            continue
        bus = normalize_bus_id(parts[1])
        if bus is not None and parts[0]:
            rows.append((normalize_uuid(parts[0]), bus, int(parts[2])))
    return rows


def smi_output(query: Sequence[str]) -> str | None:
    """What ``nvidia-smi QUERY...`` prints, or ``None`` without it or when it fails (here
    and for the node's GPU kind, ``kind.probe_products``)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        done = subprocess.run(
            [smi, *query],
            capture_output=True,
            text=True,
            timeout=SMI_TIMEOUT_SECONDS,
            check=False,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


def query_smi() -> list[tuple[str, str, int]]:
    output = smi_output(SMI_QUERY)
    return [] if output is None else parse_smi(output)


@contextlib.contextmanager
def nvml_session() -> Iterator[Any]:
    """``pynvml``, initialised for the block and shut down after it, or ``None`` without
    ``nvidia-ml-py`` or a driver that answers."""
    try:
        import pynvml  # nvidia-ml-py; optional
    except ImportError:
        yield None
        return
    try:
        pynvml.nvmlInit()
    except Exception:
        yield None
        return
    try:
        yield pynvml
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()


def query_nvml() -> list[tuple[str, str, int | None]] | None:
    """``(uuid, bus id, minor)`` per GPU through NVML, or ``None`` without ``pynvml``."""
    rows: list[tuple[str, str, int | None]] = []
    with nvml_session() as pynvml:
        if pynvml is None:
            return None
        try:
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                uuid = nvml_text(pynvml.nvmlDeviceGetUUID(handle))
                bus = normalize_bus_id(nvml_text(pynvml.nvmlDeviceGetPciInfo(handle).busId))
                minor: int | None = None
                with contextlib.suppress(Exception):
                    minor = int(pynvml.nvmlDeviceGetMinorNumber(handle))
                if bus is not None:
                    rows.append((normalize_uuid(uuid), bus, minor))
        except Exception:
            return None
    return rows


def nvml_text(value: object) -> str:
    """A string NVML gives back (bytes in older bindings, str in newer)."""
    return value.decode() if isinstance(value, bytes) else str(value)


def gpu_table(
    proc: dict[str, tuple[str | None, int]],
    listed: Sequence[tuple[str, str, int | None]],
) -> dict[str, GpuRecord]:
    """``{uuid: GpuRecord}`` from the ``/proc`` tree and NVML or nvidia-smi rows (whose third
    field is the minor number (NVML) or the nvidia-smi index: used only without ``/proc``)."""
    table: dict[str, GpuRecord] = {}
    for bus, (uuid, minor) in proc.items():
        if uuid is not None:
            table[uuid] = GpuRecord(uuid, bus, minor)
    for uuid, bus, fallback in listed:
        if uuid in table:
            continue
        if bus in proc:
            table[uuid] = GpuRecord(uuid, bus, proc[bus][1])
        elif not proc:
            table[uuid] = GpuRecord(uuid, bus, fallback)
    return table


@functools.lru_cache(maxsize=1)
def system_gpu_table() -> dict[str, GpuRecord]:
    """This machine's table, read once: ``/proc``, then NVML or nvidia-smi only if needed."""
    proc = read_proc()
    if proc and all(uuid is not None for uuid, _ in proc.values()):
        return gpu_table(proc, [])
    listed: Sequence[tuple[str, str, int | None]] | None = query_nvml()
    if not listed:
        listed = query_smi()
    return gpu_table(proc, listed)


def device_nodes(
    gpu_ids: Sequence[int], visible_devices: str, table: dict[str, GpuRecord] | None = None
) -> list[str]:
    """``/dev/nvidiaN`` for each GPU of a worker.

    ``visible_devices`` is the worker's ``CUDA_VISIBLE_DEVICES`` (UUIDs or indices, in the
    order of ``gpu_ids``). A UUID the table knows gives its driver minor number; anything
    else falls back to the CUDA index in ``gpu_ids``.
    """
    entries = [entry.strip() for entry in visible_devices.split(",")] if visible_devices else []
    nodes = []
    for position, gpu in enumerate(gpu_ids):
        entry = entries[position] if position < len(entries) else ""
        minor = None
        if entry and not entry.isdigit():
            if table is None:
                table = system_gpu_table()
            record = table.get(normalize_uuid(entry))
            minor = record.minor if record is not None else None
        node = f"/dev/nvidia{minor if minor is not None else gpu}"
        if node not in nodes:
            nodes.append(node)
    return nodes
