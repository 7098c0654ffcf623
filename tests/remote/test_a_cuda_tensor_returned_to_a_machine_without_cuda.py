"""A pickle-mode function that returns a CUDA tensor, called from a machine without CUDA.

The caller read torch's own advice, "please use torch.load with map_location=...", which no
caller of a remote function can follow: the tensor has to leave the GPU on the server's side.
There is no GPU here, so the function tags its CPU tensor's storage as ``cuda:0`` when it is
pickled, which is what a GPU worker's pickle of a CUDA tensor holds.
"""

from __future__ import annotations

import pytest

import kcoral
from kcoral.errors import ProtocolError

torch = pytest.importorskip("torch", reason="the tensor is a torch tensor")


def a_tensor_pickled_as_on_a_gpu():
    import torch
    from torch.serialization import register_package

    # Highest priority: every storage pickled in this worker from now on says "cuda:0".
    register_package(-1, lambda storage: "cuda:0", lambda storage, location: None)
    return torch.arange(3.0)


def test_the_caller_is_told_to_move_the_tensor_to_the_cpu(server_url: str) -> None:
    assert not torch.cuda.is_available()
    with kcoral.Client(server_url) as client:
        remote = client.function(serialization="pickle")(a_tensor_pickled_as_on_a_gpu)
        with pytest.raises(ProtocolError) as raised:
            remote.remote()
    message = str(raised.value)
    assert "it holds a CUDA tensor and this machine has no CUDA" in message
    assert "tensor.cpu()" in message
    assert "map_location" not in message
