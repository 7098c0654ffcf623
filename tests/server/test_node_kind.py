"""A node's kind (ROUTER §6): GPU product names normalised to short keys, the kind a server
of each device mode reports, and the ``nvidia-smi`` answer it is read from."""

from __future__ import annotations

import pytest
from kcoral_server.gpu.kind import (
    NodeKind,
    cpu_kind,
    describe_node,
    gpu_key,
    parse_smi_products,
)
from kcoral_server.pool.seat import GpuDevice

# Product names as NVML and nvidia-smi give them, and the key each one's kind is known by.
REAL_PRODUCTS = [
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H100 PCIe", "h100"),
    ("NVIDIA H100 NVL", "h100"),
    ("NVIDIA H100 80GB HBM3 MIG 1g.10gb", "h100"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA H200 NVL", "h200"),
    ("NVIDIA GH200 480GB", "gh200"),
    ("NVIDIA B200", "b200"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA A100-SXM4-40GB", "a100"),
    ("NVIDIA A100-PCIE-40GB", "a100"),
    ("NVIDIA A100 80GB PCIe", "a100"),
    ("NVIDIA A800-SXM4-80GB", "a800"),
    ("NVIDIA A10G", "a10g"),
    ("NVIDIA A10", "a10"),
    ("NVIDIA L4", "l4"),
    ("NVIDIA L40S", "l40s"),
    ("Tesla V100-SXM2-16GB", "v100"),
    ("Tesla V100-PCIE-32GB", "v100"),
    ("Tesla T4", "t4"),
    ("Tesla P100-PCIE-16GB", "p100"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("NVIDIA GeForce RTX 3090 Ti", "rtx3090ti"),
    ("NVIDIA GeForce RTX 4080 SUPER", "rtx4080super"),
    ("NVIDIA GeForce GTX 1080 Ti", "gtx1080ti"),
    ("NVIDIA RTX A6000", "rtxa6000"),
    ("NVIDIA RTX 6000 Ada Generation", "rtx6000ada"),
    ("Quadro RTX 8000", "rtx8000"),
    ("NVIDIA TITAN V", "titanv"),
]


@pytest.mark.parametrize(("product", "key"), REAL_PRODUCTS)
def test_a_real_product_name_becomes_its_short_key(product: str, key: str) -> None:
    assert gpu_key(product) == key


def test_a_key_is_short_lowercase_ascii_and_never_empty() -> None:
    assert gpu_key("NVIDIA Graphics Device") == "unknown"  # a GPU the driver cannot name
    assert gpu_key("") == "unknown"
    assert gpu_key("  nvidia   h100  ") == "h100"
    long = gpu_key("NVIDIA " + "X" * 80)
    assert long == "x" * 32
    assert gpu_key("NVIDIA Ünïcode/Thing 9") == "ncodething9"


def test_a_cpu_server_is_of_kind_cpu() -> None:
    assert describe_node("cpu", []) == cpu_kind() == NodeKind("cpu")
    assert describe_node("gpu", []) == NodeKind("cpu")  # no GPUs: nothing else to offer


def test_a_gpu_server_names_its_gpus_by_uuid_or_index() -> None:
    gpus = [GpuDevice(0, "GPU-a", "sm_90a"), GpuDevice(1, "", "sm_90a")]
    products = {
        "GPU-a": ("NVIDIA H100 80GB HBM3", 80 << 30),
        "1": ("NVIDIA H100 80GB HBM3", 79 << 30),
    }
    kind = describe_node("gpu", gpus, products)
    assert kind == NodeKind("h100", "sm_90a", 79 << 30, 2, "NVIDIA H100 80GB HBM3")
    assert kind.as_json() == {
        "gpu": "h100",
        "arch": "sm_90a",
        "memory_bytes": 79 << 30,
        "gpus": 2,
        "product": "NVIDIA H100 80GB HBM3",
    }


def test_a_gpu_no_source_names_is_of_unknown_kind_and_fake_gpus_are_fake() -> None:
    gpus = [GpuDevice(3, "GPU-x", "sm_80")]
    assert describe_node("gpu", gpus, {}) == NodeKind("unknown", "sm_80", 0, 1)
    assert describe_node("fake-gpu", gpus) == NodeKind("fake", "sm_80", 0, 1)


def test_nvidia_smi_answers_are_read_by_uuid_and_index() -> None:
    text = (
        "GPU-1111, 0, NVIDIA A100-SXM4-80GB, 81920\n"
        "GPU-2222, 1, NVIDIA A100-SXM4-80GB, [N/A]\n"
        "garbage line\n"
    )
    products = parse_smi_products(text)
    assert products["GPU-1111"] == products["0"] == ("NVIDIA A100-SXM4-80GB", 81920 << 20)
    assert products["1"] == ("NVIDIA A100-SXM4-80GB", 0)
    assert len(products) == 4
