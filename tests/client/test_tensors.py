"""Tensor inputs (CLIENT_API.md §4) for all 12 dtypes from bytes, numpy, torch and DLPack."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest

from kcoral import Program
from kcoral.protocol.dtypes import DTYPES
from kcoral.tensors import tensor_payload

torch = pytest.importorskip("torch")

NUMPY = {name: np.dtype(getattr(ml_dtypes, name, name)) for name in DTYPES}


def sample(name):
    return (np.arange(6) % 2).astype(NUMPY[name]).reshape(2, 3)


@pytest.mark.parametrize("name", DTYPES)
def test_numpy_arrays_of_every_dtype_are_accepted(name):
    array = sample(name)
    data, dtype, shape = tensor_payload(array)
    assert (dtype, shape) == (name, (2, 3))
    assert data == array.tobytes()


@pytest.mark.parametrize("name", DTYPES)
def test_torch_tensors_of_every_dtype_are_accepted(name):
    tensor = torch.from_numpy(sample(name).view(np.uint8).copy()).view(getattr(torch, name))
    tensor = tensor.reshape(2, 3)
    data, dtype, shape = tensor_payload(tensor)
    assert (dtype, shape) == (name, (2, 3))
    assert data == sample(name).tobytes()


@pytest.mark.parametrize("name", DTYPES)
def test_raw_bytes_of_every_dtype_are_accepted_with_dtype_and_shape(name):
    raw = sample(name).tobytes()
    assert tensor_payload(memoryview(raw), name, [2, 3]) == (raw, name, (2, 3))


@pytest.mark.parametrize("name", ["bool", "uint8", "int32", "float16", "float64"])
def test_dlpack_objects_are_converted_through_numpy(name):
    class Capsule:
        def __init__(self, array):
            self.array = array

        def __dlpack__(self, **kwargs):
            return self.array.__dlpack__(**kwargs)

        def __dlpack_device__(self):
            return self.array.__dlpack_device__()

    array = sample(name)
    assert tensor_payload(Capsule(array)) == (array.tobytes(), name, (2, 3))


def test_torch_views_scalars_and_grads_are_made_contiguous():
    base = torch.arange(12, dtype=torch.float32, requires_grad=True).reshape(3, 4)
    data, _, shape = tensor_payload(base.t())
    assert shape == (4, 3) and data == base.detach().t().contiguous().numpy().tobytes()
    assert tensor_payload(torch.tensor(2.5, dtype=torch.bfloat16))[2] == ()
    assert tensor_payload(torch.zeros(0, 3, dtype=torch.float16))[0] == b""


ODD_STRIDED = {
    "one element of a column": lambda dtype: torch.arange(16).to(dtype).reshape(4, 4)[0:1, 2],
    "an empty column": lambda dtype: torch.arange(16).to(dtype).reshape(4, 4)[:0, 1],
    "a 1x1 block": lambda dtype: torch.arange(16).to(dtype).reshape(4, 4)[2:3, 1:2],
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64])
@pytest.mark.parametrize("make", ODD_STRIDED.values(), ids=ODD_STRIDED)
def test_a_torch_tensor_of_at_most_one_element_with_any_stride_uploads_its_bytes(make, dtype):
    # contiguous() keeps such a tensor's stride, which torch's byte view refused
    tensor = make(dtype)
    data, _, shape = tensor_payload(tensor)
    assert shape == tuple(tensor.shape)
    assert (
        data
        == tensor.clone(memory_format=torch.contiguous_format)
        .view(-1)
        .view(torch.uint8)
        .numpy()
        .tobytes()
    )


def test_a_torch_negative_view_uploads_its_resolved_values():
    tensor = torch.tensor([1 + 2j, 3 - 4j]).conj().imag  # the sign bit is lazy
    assert tensor.is_neg()
    data, dtype, _ = tensor_payload(tensor)
    assert np.frombuffer(data, np.float32).tolist() == [-2.0, 4.0] and dtype == "float32"


NO_BYTES = {
    "sparse": (lambda: torch.eye(3).to_sparse(), "of layout torch.sparse_coo (tensor.to_dense()"),
    "csr": (lambda: torch.eye(3).to_sparse_csr(), "of layout torch.sparse_csr"),
    "nested": (
        lambda: torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]),
        "that is nested (it has no single shape; tensor.unbind()",
    ),
    "meta": (lambda: torch.empty(3, device="meta"), "on the meta device (it holds no data)"),
}


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch: nested and CSR are beta
@pytest.mark.parametrize(("make", "words"), NO_BYTES.values(), ids=NO_BYTES)
def test_a_torch_tensor_without_dense_bytes_is_refused_saying_what_to_send(make, words):
    # torch's own words: 'unsupported memory format option Contiguous', 'Internal error: ...'
    with pytest.raises(TypeError) as refused:
        tensor_payload(make())
    assert str(refused.value).startswith(f"cannot send a tensor {words}")


def test_big_endian_and_strided_numpy_arrays_become_little_endian_c_order():
    array = np.arange(6, dtype=">i4").reshape(2, 3)[:, ::2]
    data, dtype, shape = tensor_payload(array)
    assert (dtype, shape) == ("int32", (2, 2))
    assert data == np.ascontiguousarray(array.astype("<i4")).tobytes()


# A strided 64 MiB view of a 128 MiB array or tensor, its payload taken, and the memory
# that took beyond what the process held (the peak, VmHWM, reset just before it).
_STRIDED_PAYLOAD_COST = """
import sys, numpy as np, torch
from kcoral.tensors import tensor_payload

def kib(field):
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith(field))

if sys.argv[1] == "numpy":
    view = np.ones((4096, 8192), np.float32)[:, ::2]
else:
    view = torch.ones((4096, 16384), dtype=torch.bfloat16)[:, ::2]
with open("/proc/self/clear_refs", "w") as clear:
    clear.write("5")  # the peak is what the process holds now
held = kib("VmRSS:")
data = tensor_payload(view)[0]
print((kib("VmHWM:") - held) * 1024, len(data))
"""


@pytest.mark.parametrize("library", ["numpy", "torch"])
def test_a_strided_array_or_tensor_is_copied_once_when_uploaded(library):
    # a column slice of a big array made a whole contiguous copy and then its bytes: a
    # 1 GiB view held 2 GiB more at its upload, where its bytes alone are 1 GiB
    script = textwrap.dedent(_STRIDED_PAYLOAD_COST)
    answer = subprocess.run(
        [sys.executable, "-c", script, library], capture_output=True, text=True, timeout=60
    )
    assert answer.returncode == 0, answer.stderr
    grown, payload = map(int, answer.stdout.split())
    assert payload == 64 << 20
    assert grown < payload * 3 // 2, f"{grown >> 20} MiB for a {payload >> 20} MiB payload"


def test_a_numpy_scalar_shape_is_empty():
    assert tensor_payload(np.float32(1.0)) == (np.float32(1.0).tobytes(), "float32", ())
    assert tensor_payload(np.array(3, dtype=np.int64))[2] == ()


def test_duck_typed_objects_are_the_last_resort():
    class Duck:
        dtype = "uint8"
        shape = (3,)

        def tobytes(self):
            return b"abc"

    assert tensor_payload(Duck()) == (b"abc", "uint8", (3,))


@pytest.mark.parametrize(
    ("value", "dtype", "shape", "error"),
    [
        (b"abcd", None, [4], TypeError),
        (b"abcd", "uint8", None, TypeError),
        (b"abcd", "uint8", [3], ValueError),
        (b"abcd", "complex64", [4], ValueError),
        (b"abcd", "uint8", [-4], ValueError),
        (b"abcd", "uint8", [True, 4], TypeError),
        (b"abcd", "uint8", "4", TypeError),
        (b"abcd", "uint8", 4, TypeError),
        (np.zeros(2, np.float32), "float64", None, ValueError),
        (np.zeros(2, np.float32), None, [1, 2], ValueError),
        (np.zeros(2, np.complex64), None, None, ValueError),
        (np.array(["a"]), None, None, ValueError),
        ([1, 2, 3], None, None, TypeError),
        ("text", "uint8", [4], TypeError),
    ],
)
def test_bad_tensor_inputs_are_refused(value, dtype, shape, error):
    with pytest.raises(error):
        tensor_payload(value, dtype, shape)
    program = Program()
    with pytest.raises(error):
        program.upload(kind="tensor", value=value, dtype=dtype, shape=shape)
    assert program.instructions == []


def test_matching_dtype_and_shape_may_be_repeated_for_arrays():
    array = np.zeros((2, 2), np.float16)
    assert tensor_payload(array, "float16", (2, 2))[1:] == ("float16", (2, 2))


def test_a_torch_tensor_that_numpy_cannot_take_via_dlpack_still_works_as_torch():
    tensor = torch.ones(2, dtype=torch.float8_e5m2)
    assert tensor_payload(tensor)[1] == "float8_e5m2"
