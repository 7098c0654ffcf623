"""Server-side value encoding (PROTOCOL.md §7.5, EXTENSIONS.md §2) and shared node rules."""

from __future__ import annotations

import hashlib
import subprocess
import sys
from collections import OrderedDict
from typing import Any

import ml_dtypes
import numpy as np
import pytest
import torch

from kcoral.protocol.dtypes import DTYPES, ITEMSIZE, numpy_dtype
from kcoral.protocol.values import (
    NODE_FIELDS,
    ValueEncodingError,
    encode_value,
    file_node,
    folder_directories,
    folder_manifest_problem,
    folder_node,
    part_index,
    part_name,
)


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


class DLPackOnly:
    """An object that only speaks DLPack (like a CuPy or JAX array would)."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self.inner.__dlpack__(**kwargs)

    def __dlpack_device__(self) -> Any:
        return self.inner.__dlpack_device__()


@pytest.mark.parametrize(
    ("value", "node"),
    [
        (None, {"type": "null"}),
        (True, {"type": "boolean", "value": True}),
        (False, {"type": "boolean", "value": False}),
        (42, {"type": "integer", "value": 42}),
        (-(2**80), {"type": "integer", "value": -(2**80)}),
        (2.5, {"type": "number", "value": 2.5}),
        ("text ✓", {"type": "string", "value": "text ✓"}),
        ([], {"type": "array", "value": []}),
        (
            (1, None),
            {"type": "array", "value": [{"type": "integer", "value": 1}, {"type": "null"}]},
        ),
        ({}, {"type": "object", "value": {}}),
        ({"k": "v"}, {"type": "object", "value": {"k": {"type": "string", "value": "v"}}}),
        (np.bool_(True), {"type": "boolean", "value": True}),
        (np.int8(-3), {"type": "integer", "value": -3}),
        (np.uint64(2**64 - 1), {"type": "integer", "value": 2**64 - 1}),
        (np.float16(0.5), {"type": "number", "value": 0.5}),
        (np.float32(1.5), {"type": "number", "value": 1.5}),
        (ml_dtypes.bfloat16(2.0), {"type": "number", "value": 2.0}),
    ],
)
def test_json_values_encode_to_exact_nodes(value: object, node: dict) -> None:
    encoded, parts = encode_value(value, 0)
    assert encoded == node and parts == []
    assert type(encoded.get("value")) is type(node.get("value"))
    assert set(encoded) == NODE_FIELDS[encoded["type"]]


def test_object_insertion_order_is_kept() -> None:
    encoded, _ = encode_value(OrderedDict([("b", 1), ("a", 2)]), 0)
    assert list(encoded["value"]) == ["b", "a"]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf"), np.float64("nan")])
def test_non_finite_numbers_cannot_be_encoded(value: float) -> None:
    with pytest.raises(ValueEncodingError, match="non-finite"):
        encode_value([value], 0)


@pytest.mark.parametrize("key", [1, None, (1,), b"k", 1.5])
def test_dict_keys_must_be_str(key: object) -> None:
    with pytest.raises(ValueEncodingError, match="keys must be str"):
        encode_value({key: 1}, 0)


def test_self_referencing_containers_cannot_be_encoded() -> None:
    looped: list[Any] = [1]
    looped.append(looped)
    mapping: dict[str, Any] = {}
    mapping["me"] = [mapping]
    for value in (looped, mapping, (looped,)):
        with pytest.raises(ValueEncodingError, match="self-referencing"):
            encode_value(value, 0)


def test_a_shared_but_acyclic_value_is_encoded_each_time_it_appears() -> None:
    shared = b"xy"
    inner = [shared]
    encoded, parts = encode_value([inner, inner, {"a": inner}], 0)
    assert parts == [b"xy", b"xy", b"xy"]
    assert encoded["value"][1]["value"][0]["part"] == "return:1"


@pytest.mark.parametrize(
    ("value", "type_name"),
    [(len, "builtin_function_or_method"), (lambda: 1, "function"), (object(), "object"),
     ({1, 2}, "set"), (1j, "complex"), (sys, "module"), (int, "type")],
)  # fmt: skip
def test_other_objects_cannot_be_encoded(value: object, type_name: str) -> None:
    with pytest.raises(ValueEncodingError) as info:
        encode_value(value, 0)
    assert info.value.message == f"cannot encode value of type {type_name!r}"


def test_lone_surrogates_in_strings_and_keys_cannot_be_encoded() -> None:
    with pytest.raises(ValueEncodingError):
        encode_value("\ud800", 0)
    with pytest.raises(ValueEncodingError):
        encode_value({"\udfff": 1}, 0)


def test_very_deep_nesting_is_an_encoding_error_not_a_crash() -> None:
    deep: list[Any] = []
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(ValueEncodingError, match="deeply"):
        encode_value(deep, 0)


# ----------------------------------------------------------------------------- binaries


def test_binary_parts_are_numbered_depth_first_from_the_first_index() -> None:
    value = {
        "a": b"one",
        "b": [bytearray(b"two"), {"c": memoryview(b"three")}, np.arange(2, dtype=np.int16)],
        "d": b"four",
    }
    encoded, parts = encode_value(value, 7)
    assert [bytes(p) for p in parts] == [b"one", b"two", b"three", b"\0\0\1\0", b"four"]
    nodes = [
        encoded["value"]["a"],
        encoded["value"]["b"]["value"][0],
        encoded["value"]["b"]["value"][1]["value"]["c"],
        encoded["value"]["b"]["value"][2],
        encoded["value"]["d"],
    ]
    assert [n["part"] for n in nodes] == [f"return:{i}" for i in range(7, 12)]
    for node, part in zip(nodes, parts, strict=True):
        assert node["sha256"] == sha(bytes(part))
        assert set(node) == NODE_FIELDS[node["type"]]
    assert nodes[0] == {"type": "bytes", "part": "return:7", "sha256": sha(b"one")}
    assert nodes[3]["dtype"] == "int16" and nodes[3]["shape"] == [2]


def test_a_non_contiguous_memoryview_is_encoded_as_its_c_order_bytes() -> None:
    view = memoryview(bytes(range(10)))[::2]
    _, [part] = encode_value(view, 0)
    assert bytes(part) == bytes([0, 2, 4, 6, 8])
    typed = memoryview(np.array([1, 2], dtype="<i4"))
    _, [part] = encode_value(typed, 0)
    assert bytes(part) == b"\1\0\0\0\2\0\0\0"


# ------------------------------------------------------------------------------ tensors


def reference_bytes(dtype: str) -> tuple[np.ndarray, bytes]:
    array = (np.arange(6, dtype=np.float64).reshape(2, 3) % 2).astype(numpy_dtype(dtype))
    return array, array.tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_protocol_dtype_encodes_from_numpy(dtype: str) -> None:
    array, expected = reference_bytes(dtype)
    node, [part] = encode_value(array, 0)
    assert node == {
        "type": "tensor",
        "dtype": dtype,
        "shape": [2, 3],
        "part": "return:0",
        "sha256": sha(expected),
    }
    assert bytes(part) == expected and len(expected) == 6 * ITEMSIZE[dtype]


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_protocol_dtype_encodes_from_torch(dtype: str) -> None:
    _, expected = reference_bytes(dtype)
    tensor = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0]]).to(getattr(torch, dtype))
    node, [part] = encode_value(tensor, 3)
    assert (node["dtype"], node["shape"], node["part"]) == (dtype, [2, 3], "return:3")
    assert bytes(part) == expected and node["sha256"] == sha(expected)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float8_e5m2"])
def test_dlpack_objects_encode_through_numpy_or_torch(dtype: str) -> None:
    _, expected = reference_bytes(dtype)
    tensor = torch.tensor([[0.0, 1.0, 0.0], [1.0, 0.0, 1.0]]).to(getattr(torch, dtype))
    node, [part] = encode_value(DLPackOnly(tensor), 0)
    assert (node["dtype"], node["shape"]) == (dtype, [2, 3])
    assert bytes(part) == expected


def test_a_dlpack_object_from_numpy_encodes() -> None:
    array = np.arange(4, dtype=np.int32)
    node, [part] = encode_value(DLPackOnly(array), 0)
    assert (node["dtype"], node["shape"], bytes(part)) == ("int32", [4], array.tobytes())


def test_a_broken_dlpack_object_is_an_encoding_error() -> None:
    class Broken:
        def __dlpack__(self, **kwargs: Any) -> Any:
            raise RuntimeError("no")

        def __dlpack_device__(self) -> Any:
            return (1, 0)

    with pytest.raises(ValueEncodingError, match="DLPack"):
        encode_value(Broken(), 0)


def test_tensors_are_made_little_endian_c_contiguous_and_detached() -> None:
    big = np.arange(6, dtype=">i4").reshape(2, 3).T
    node, [part] = encode_value(big, 0)
    assert node["shape"] == [3, 2] and node["dtype"] == "int32"
    assert bytes(part) == np.ascontiguousarray(big).astype("<i4").tobytes()

    grad = torch.arange(6, dtype=torch.float32, requires_grad=True).reshape(2, 3).t()
    node, [part] = encode_value(grad, 0)
    assert node["shape"] == [3, 2]
    assert bytes(part) == grad.detach().contiguous().numpy().tobytes()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int16])
@pytest.mark.parametrize(
    "index",
    [(slice(0, 1), 2), (slice(0, 0), 1), (slice(2, 3), slice(1, 2))],
    ids=["one element of a column", "an empty column", "a 1x1 block"],
)
def test_a_torch_tensor_of_at_most_one_element_with_any_stride_encodes(
    dtype: torch.dtype, index: tuple
) -> None:
    # contiguous() keeps such a tensor's stride, which torch's byte view refused
    tensor = torch.arange(16).to(dtype).reshape(4, 4)[index]
    node, [part] = encode_value(tensor, 0)
    assert node["shape"] == list(tensor.shape)
    expected = tensor.clone(memory_format=torch.contiguous_format).view(-1).view(torch.uint8)
    assert bytes(part) == expected.numpy().tobytes()


def test_a_torch_negative_view_encodes_its_resolved_values() -> None:
    tensor = torch.tensor([1 + 2j]).conj().imag  # one element: contiguous() keeps the view
    assert tensor.is_neg()
    _, [part] = encode_value(tensor, 0)
    assert np.frombuffer(bytes(part), np.float32).tolist() == [-2.0]


@pytest.mark.parametrize(
    ("value", "what", "size"),
    [
        (np.broadcast_to(np.zeros(1, np.float32), (2**40,)), "a tensor", 2**42),
        (torch.zeros(1, dtype=torch.float64).expand(2**40), "a tensor", 2**43),
        (memoryview(b"x" * 1001), "bytes", 1001),
    ],
    ids=["numpy broadcast", "torch expand", "bytes"],
)
def test_a_value_past_its_part_budget_fails_before_its_bytes_are_made(
    value: object, what: str, size: int
) -> None:
    # a broadcast view of 4 bytes copied to 4 TiB: the worker was killed at its memory limit
    with pytest.raises(ValueEncodingError) as refused:
        encode_value(value, 0, part_budget=1000)
    assert str(refused.value) == (
        f"return would exceed the response size limit: {what} of {size} bytes, 1000 bytes "
        "left (max_response_bytes; kcoral server --max-response-bytes)"
    )


def test_the_parts_of_one_value_share_its_budget() -> None:
    pair = [np.zeros(100, np.uint8), b"y" * 100]
    _, parts = encode_value(pair, 0, part_budget=200)
    assert [memoryview(part).nbytes for part in parts] == [100, 100]
    with pytest.raises(ValueEncodingError, match="bytes of 100 bytes, 99 bytes left"):
        encode_value(pair, 0, part_budget=199)


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch: nested and CSR are beta
@pytest.mark.parametrize(
    ("make", "words"),
    [
        (lambda: torch.eye(3).to_sparse(), "of layout torch.sparse_coo (tensor.to_dense()"),
        (lambda: torch.eye(3).to_sparse_csr(), "of layout torch.sparse_csr"),
        (lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]), "that is nested"),
        (lambda: torch.empty(3, device="meta"), "on the meta device (it holds no data)"),
    ],
    ids=["sparse", "csr", "nested", "meta"],
)
def test_a_torch_tensor_without_dense_bytes_fails_its_return_saying_what_to_return(
    make: Any, words: str
) -> None:
    # torch's own words: 'unsupported memory format option Contiguous', 'Internal error: ...'
    with pytest.raises(ValueEncodingError) as refused:
        encode_value(make(), 0)
    assert str(refused.value).startswith(f"cannot encode a tensor {words}")


@pytest.mark.parametrize(
    "shape", [(0,) * 65, (1,) * 65, (2**63 - 1, 0)], ids=["65 empty", "65 of 1", "2**63-1 by 0"]
)
def test_a_torch_tensor_numpy_cannot_hold_fails_its_return_not_the_whole_answer(
    shape: tuple[int, ...],
) -> None:
    # torch makes them; the client's decoder refused the whole answer for one
    with pytest.raises(ValueEncodingError, match=r"^cannot encode a tensor of shape \[.*64 dim"):
        encode_value(torch.empty(shape, dtype=torch.float32), 0)
    node, _ = encode_value(torch.empty((0,) * 64, dtype=torch.uint8), 0)
    assert node["shape"] == [0] * 64


@pytest.mark.parametrize("shape", [(), (0,), (2, 0, 3)])
def test_scalar_and_zero_size_tensors_encode(shape: tuple[int, ...]) -> None:
    for value in (np.zeros(shape, np.float32), torch.zeros(shape, dtype=torch.bfloat16)):
        node, [part] = encode_value(value, 0)
        assert node["shape"] == list(shape)
        assert memoryview(part).nbytes == int(np.prod(shape)) * ITEMSIZE[node["dtype"]]


@pytest.mark.parametrize(
    "value",
    [
        np.zeros(2, np.complex64),
        np.zeros(2, np.uint16),
        np.array(["a"]),
        np.array([object()]),
        torch.zeros(2, dtype=torch.complex64),
        torch.zeros(2, dtype=torch.uint16),
        torch.zeros(2, dtype=torch.float8_e4m3fnuz),
    ],
)
def test_tensors_of_other_dtypes_cannot_be_encoded(value: object) -> None:
    with pytest.raises(ValueEncodingError, match="dtype"):
        encode_value(value, 0)


def test_torch_is_never_imported_by_the_encoder() -> None:
    code = (
        "import sys, numpy as np\n"
        "from kcoral.protocol.values import encode_value\n"
        "encode_value([np.zeros(2, np.float32), b'x', 1.5], 0)\n"
        "assert 'torch' not in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


# ----------------------------------------------------------------- files and folders


def test_a_file_node_carries_size_part_and_hash() -> None:
    node, part = file_node(bytearray(b"hello\n"), 4)
    assert node == {"type": "file", "size": 6, "part": "return:4", "sha256": sha(b"hello\n")}
    assert bytes(part) == b"hello\n"


def test_a_folder_node_sorts_files_lists_ancestors_and_numbers_depth_first() -> None:
    node, parts = folder_node(
        [("z.txt", b"z"), ("a/b/c.bin", b"c"), (".hidden", b"h"), ("a.txt", b"a")],
        ["empty/inner", "a"],
        2,
    )
    assert list(node["files"]) == [".hidden", "a.txt", "a/b/c.bin", "z.txt"]
    assert node["directories"] == ["a", "a/b", "empty", "empty/inner"]
    assert [bytes(p) for p in parts] == [b"h", b"a", b"c", b"z"]
    assert [n["part"] for n in node["files"].values()] == [f"return:{i}" for i in range(2, 6)]
    assert node["files"]["a/b/c.bin"] == {
        "type": "file",
        "size": 1,
        "part": "return:4",
        "sha256": sha(b"c"),
    }
    assert set(node) == NODE_FIELDS["folder"]


def test_an_empty_folder_has_no_files_and_no_directories() -> None:
    assert folder_node([], [], 0) == ({"type": "folder", "files": {}, "directories": []}, [])


@pytest.mark.parametrize(
    ("files", "directories"),
    [
        ([("a", b""), ("a", b"")], []),
        ([("a", b""), ("a/b", b"")], []),
        ([("a", b"")], ["a"]),
        ([("./a", b"")], []),
        ([("../a", b"")], []),
    ],
)
def test_an_invalid_folder_listing_is_an_encoding_error(
    files: list[tuple[str, bytes]], directories: list[str]
) -> None:
    with pytest.raises(ValueEncodingError, match="invalid folder"):
        folder_node(files, directories, 0)


@pytest.mark.parametrize(
    ("files", "directories", "problem"),
    [
        (["a", "b/c"], ["b"], None),
        ([], [], None),
        (["b", "a"], [], "sorted"),
        (["a", "a"], [], "sorted"),
        (["a/b"], [], "parent"),
        (["x"], ["d/e"], "parent"),
        (["a"], ["a"], "both"),
        (["a//b"], ["a"], "normalized"),
        (["/a"], [], "invalid"),
    ],
)
def test_folder_manifest_rules(
    files: list[str], directories: list[str], problem: str | None
) -> None:
    found = folder_manifest_problem(files, directories)
    assert (found is None) if problem is None else (problem in (found or ""))


def test_folder_directories_lists_every_ancestor_once() -> None:
    assert folder_directories(["a/b/c", "a/d"], ["e"]) == ["a", "a/b", "e"]


@pytest.mark.parametrize(
    ("name", "index"),
    [("return:0", 0), ("return:12", 12), ("return:01", None), ("return:-1", None),
     ("return:+1", None), ("return:", None), ("return:١", None), ("result", None), (3, None)],
)  # fmt: skip
def test_part_names_are_canonical_decimals(name: object, index: int | None) -> None:
    assert part_index(name) == index
    if index is not None:
        assert part_name(index) == name


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_cuda_tensors_and_cuda_dlpack_objects_are_copied_to_host() -> None:
    tensor = torch.arange(6, dtype=torch.bfloat16, device="cuda").reshape(2, 3)
    expected = tensor.cpu().view(torch.uint8).numpy().tobytes()
    for value in (tensor, DLPackOnly(tensor)):
        node, [part] = encode_value(value, 0)
        assert (node["dtype"], node["shape"], bytes(part)) == ("bfloat16", [2, 3], expected)
