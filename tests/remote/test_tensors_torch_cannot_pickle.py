"""torch tensors of the dtypes torch itself cannot unpickle (float8, uint16/32/64,
complex32, float4) in a pickle-mode remote call, both ways (EXTENSIONS §4). Before, such an
argument failed the call with ``cannot unpickle the remote call: AttributeError: type object
'torch.storage.UntypedStorage' has no attribute 'dtype'`` and fifteen lines of torch's
traceback; such a result failed alike on the client."""

from __future__ import annotations

import pytest

from kcoral import Client
from kcoral.protocol.pickle_envelope import VIEWED_TORCH_DTYPES, dump_envelope, load_envelope

torch = pytest.importorskip("torch", reason="torch is not installed")


def sample(name: str) -> torch.Tensor:
    """A non-contiguous 3x3 tensor of dtype ``name`` over distinct bytes."""
    dtype = getattr(torch, name)
    raw = torch.arange(12 * dtype.itemsize, dtype=torch.uint8) % 120
    return raw.view(dtype).reshape(3, 4).t()[1:]


def as_bytes(tensor: torch.Tensor) -> list[int]:
    return tensor.contiguous().view(torch.uint8).flatten().tolist()


@pytest.mark.parametrize("name", [n for n in VIEWED_TORCH_DTYPES if hasattr(torch, n)])
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_a_tensor_of_a_dtype_torch_cannot_pickle_comes_through_an_envelope_unchanged(
    name: str,
) -> None:
    tensor = sample(name)
    back = load_envelope(dump_envelope({"t": tensor}), writer="client", reader="server")["t"]
    assert back.dtype == tensor.dtype
    assert (back.shape, back.stride()) == (tensor.shape, tensor.stride())
    assert as_bytes(back) == as_bytes(tensor)


def test_a_gradient_flag_and_other_tensors_are_kept() -> None:
    leaf = torch.ones(2, requires_grad=True)
    plain = torch.arange(3, dtype=torch.bfloat16)
    back = load_envelope(dump_envelope([leaf, plain]), writer="client", reader="server")
    assert back[0].requires_grad and back[0].tolist() == [1.0, 1.0]
    assert back[1].dtype == torch.bfloat16 and back[1].tolist() == [0.0, 1.0, 2.0]


def twice_as_other_dtypes(x: torch.Tensor) -> dict[str, torch.Tensor]:
    import torch

    doubled = (x.float() * 2).to(torch.float8_e5m2)
    return {"in": x, "e5m2": doubled, "u16": torch.arange(4, dtype=torch.int32).to(torch.uint16)}


def test_a_float8_tensor_goes_to_a_pickle_mode_function_and_float8_and_uint16_come_back(
    server_url: str,
) -> None:
    x = torch.tensor([0.5, 1.0, 1.5, -2.0]).to(torch.float8_e4m3fn)
    with Client(server_url) as client:
        function = client.function(serialization="pickle")(twice_as_other_dtypes)
        out = function.remote(x)
    assert out["in"].dtype == torch.float8_e4m3fn and out["in"].float().tolist() == [
        0.5,
        1.0,
        1.5,
        -2.0,
    ]
    assert out["e5m2"].dtype == torch.float8_e5m2
    assert out["e5m2"].float().tolist() == [1.0, 2.0, 3.0, -4.0]
    assert out["u16"].dtype == torch.uint16 and out["u16"].int().tolist() == [0, 1, 2, 3]
