"""Device files by identity (SERVER §14): ``/dev/nvidiaN`` is found from the GPU's UUID
through the driver's ``/proc`` tree or NVML/nvidia-smi, not from CUDA's enumeration order.

The ``nvidia-smi`` output and ``information`` files below are recorded from the formats
driver 5xx prints (``nvidia-smi --query-gpu=uuid,pci.bus_id,index --format=csv,noheader``;
``/proc/driver/nvidia/gpus/<bus>/information``) on a two-GPU machine whose driver minor
numbers run opposite to PCI order, as they can on machines with swapped slots.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from kcoral_server.gpu import device_nodes as gpu_devices
from kcoral_server.gpu.device_nodes import (
    GpuRecord,
    device_nodes,
    gpu_table,
    normalize_bus_id,
    parse_smi,
    read_proc,
)
from kcoral_server.processes.sandbox import SandboxDir

UUID_A = "GPU-5a1f9a3e-2c4b-11ee-8c90-0242ac120002"
UUID_B = "GPU-e04b7c21-9d3a-4f55-b1c6-7f2d0c9a8e11"

SMI_OUTPUT = f"""\
{UUID_A}, 00000000:3B:00.0, 0
{UUID_B}, 00000000:D8:00.0, 1
"""

INFORMATION = """\
Model: \t\t NVIDIA H200
IRQ:   \t\t 168
GPU UUID: \t {uuid}
Video BIOS: \t 96.00.af.00.01
Bus Type: \t PCIe
DMA Size: \t 52 bits
DMA Mask: \t 0xfffffffffffff
Bus Location: \t {bus}
Device Minor: \t {minor}
GPU Excluded:\t No
"""


def fake_proc(root: Path, *, with_uuids: bool = True) -> Path:
    """Two GPUs: 3b (UUID_A) has minor 1, d8 (UUID_B) has minor 0."""
    for bus, uuid, minor in (("0000:3b:00.0", UUID_A, 1), ("0000:d8:00.0", UUID_B, 0)):
        folder = root / bus
        folder.mkdir(parents=True)
        text = INFORMATION.format(uuid=uuid, bus=bus, minor=minor)
        if not with_uuids:
            text = "\n".join(line for line in text.splitlines() if "UUID" not in line)
        (folder / "information").write_text(text)
    return root


def test_bus_ids_of_every_tool_normalize_to_one_spelling() -> None:
    assert normalize_bus_id("00000000:3B:00.0") == "0000:3b:00.0"
    assert normalize_bus_id("0000:d8:00.0") == "0000:d8:00.0"
    assert normalize_bus_id("3B:00.0") == "0000:3b:00.0"
    assert normalize_bus_id("not a bus") is None


def test_the_recorded_nvidia_smi_output_parses() -> None:
    assert parse_smi(SMI_OUTPUT + "\n[N/A], , \n") == [
        (UUID_A, "0000:3b:00.0", 0),
        (UUID_B, "0000:d8:00.0", 1),
    ]


def test_the_proc_tree_gives_each_uuid_its_device_minor(tmp_path: Path) -> None:
    proc = read_proc(fake_proc(tmp_path))
    assert proc == {"0000:3b:00.0": (UUID_A, 1), "0000:d8:00.0": (UUID_B, 0)}
    table = gpu_table(proc, [])
    assert table[UUID_A] == GpuRecord(UUID_A, "0000:3b:00.0", 1)
    assert table[UUID_B].minor == 0


def test_the_device_file_follows_the_uuid_not_the_cuda_index(tmp_path: Path) -> None:
    table = gpu_table(read_proc(fake_proc(tmp_path)), [])
    # CUDA index 0 is UUID_A (fastest first), but the driver calls it /dev/nvidia1
    assert device_nodes([0], UUID_A, table) == ["/dev/nvidia1"]
    assert device_nodes([1], UUID_B, table) == ["/dev/nvidia0"]
    assert device_nodes([0, 1], f"{UUID_A},{UUID_B}", table) == ["/dev/nvidia1", "/dev/nvidia0"]


def test_a_proc_tree_without_uuids_is_joined_through_nvidia_smi_bus_ids(tmp_path: Path) -> None:
    proc = read_proc(fake_proc(tmp_path, with_uuids=False))
    assert proc == {"0000:3b:00.0": (None, 1), "0000:d8:00.0": (None, 0)}
    table = gpu_table(proc, parse_smi(SMI_OUTPUT))
    assert device_nodes([0], UUID_A, table) == ["/dev/nvidia1"]  # not nvidia-smi's index 0


def test_without_proc_the_nvml_minor_or_nvidia_smi_index_is_used() -> None:
    table = gpu_table({}, parse_smi(SMI_OUTPUT))
    assert device_nodes([1], UUID_A, table) == ["/dev/nvidia0"]
    assert device_nodes([0], UUID_B, table) == ["/dev/nvidia1"]


def test_an_unknown_uuid_or_a_bare_index_keeps_the_cuda_index() -> None:
    table = gpu_table({}, parse_smi(SMI_OUTPUT))
    assert device_nodes([2], "GPU-00000000-0000-0000-0000-000000000000", table) == ["/dev/nvidia2"]
    assert device_nodes([3], "3", table) == ["/dev/nvidia3"]
    assert device_nodes([4], "", table) == ["/dev/nvidia4"]
    assert device_nodes([5], "MIG-1234", table) == ["/dev/nvidia5"]


def test_a_uuid_without_the_gpu_prefix_is_found(tmp_path: Path) -> None:
    table = gpu_table(read_proc(fake_proc(tmp_path)), [])
    assert device_nodes([0], UUID_B[4:], table) == ["/dev/nvidia0"]


def test_a_missing_proc_tree_reads_as_empty(tmp_path: Path) -> None:
    assert read_proc(tmp_path / "absent") == {}


def test_the_sandbox_binds_the_device_file_of_the_workers_uuid(monkeypatch, tmp_path) -> None:
    table = gpu_table({}, parse_smi(SMI_OUTPUT))
    monkeypatch.setattr(gpu_devices, "system_gpu_table", lambda: table)
    box = SandboxDir(
        device="gpu",
        gpu_ids=[0],
        bwrap="/opt/bwrap",
        environ={"CUDA_VISIBLE_DEVICES": UUID_B},
    )
    try:
        argv = box.command(["python", "-m", "kcoral_server.worker"])
    finally:
        box.remove()
    binds = {argv[i + 1] for i, arg in enumerate(argv) if arg == "--dev-bind-try"}
    assert "/dev/nvidia1" in binds  # UUID_B is nvidia-smi's GPU 1 though CUDA calls it 0
    assert "/dev/nvidia0" not in binds


@pytest.mark.parametrize("answer", ["", "garbage\n", "GPU-x, 00000000:3B:00.0, N/A\n"])
def test_unusable_nvidia_smi_output_gives_no_rows(answer: str) -> None:
    assert parse_smi(answer) == []
