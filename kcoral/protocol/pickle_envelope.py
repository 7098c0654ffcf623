"""The KCoral pickle envelope (EXTENSIONS §4): a cloudpickle payload behind a header naming
the writer's Python and cloudpickle versions, so a mismatch is reported in words before
anything is unpickled.

Its own module, importing only the standard library (cloudpickle when dumping or checking
versions): a server worker's pickle-mode call imported it from ``kcoral.remote``, whose
client-side imports (the program builder, the connection code) cost a fresh worker
35-50 ms, most of a pickle call's time on the server. ``kcoral.remote`` still offers these
names, for uploaded code of older clients.
"""

from __future__ import annotations

import functools
import io
import json
import pickle
import sys
from typing import Any

PICKLE_MAGIC = b"KCORAL-PICKLE/1\n"


class PickleVersionError(ValueError):
    """The two ends of a pickle-mode call run incompatible Python or cloudpickle versions."""


def runtime_versions() -> dict[str, str]:
    """What must match between both ends of a pickle-mode call."""
    import cloudpickle

    return {
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "cloudpickle": cloudpickle.__version__,
    }


#: torch dtypes that torch itself cannot unpickle (no typed storage: ``AttributeError:
#: type object 'torch.storage.UntypedStorage' has no attribute 'dtype'``, torch 2.x), so a
#: float8 tensor failed a pickle-mode call with torch's traceback; they travel as a view of
#: the integer type of their size and are viewed back.
VIEWED_TORCH_DTYPES = (
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
    "float4_e2m1fn_x2",
    "uint16",
    "uint32",
    "uint64",
    "complex32",
)
_INTEGER_OF_SIZE = {1: "uint8", 2: "int16", 4: "int32", 8: "int64"}


def viewed_back(tensor: Any, dtype_name: str, requires_grad: bool) -> Any:
    """A tensor sent as an integer view (``VIEWED_TORCH_DTYPES``), as its own dtype again
    (same storage, shape and strides)."""
    import torch

    return tensor.view(getattr(torch, dtype_name)).requires_grad_(requires_grad)


def _reduce_unpicklable_dtype(value: Any) -> Any:
    """How a torch tensor of a ``VIEWED_TORCH_DTYPES`` dtype pickles, else NotImplemented."""
    torch = sys.modules.get("torch")  # no tensor without torch loaded: never imported here
    if torch is None or type(value) is not torch.Tensor:
        return NotImplemented
    name = str(value.dtype).removeprefix("torch.")
    if name not in VIEWED_TORCH_DTYPES:
        return NotImplemented
    integer = getattr(torch, _INTEGER_OF_SIZE[value.dtype.itemsize])
    return viewed_back, (value.detach().view(integer), name, value.requires_grad)


@functools.cache
def _pickler() -> type:
    """cloudpickle's pickler, with torch's unpicklable dtypes viewed (made at first use:
    cloudpickle is imported only when pickle is)."""
    import cloudpickle

    class Pickler(cloudpickle.Pickler):  # type: ignore[misc]
        def reducer_override(self, obj: Any) -> Any:
            reduced = _reduce_unpicklable_dtype(obj)
            return super().reducer_override(obj) if reduced is NotImplemented else reduced

    return Pickler


def dump_envelope(value: Any) -> bytes:
    """``value`` pickled by cloudpickle behind a header naming this side's versions."""
    header = json.dumps(runtime_versions(), sort_keys=True).encode("ascii")
    pickled = io.BytesIO()
    _pickler()(pickled).dump(value)
    return PICKLE_MAGIC + header + b"\n" + pickled.getvalue()


def load_envelope(data: bytes | memoryview, *, writer: str, reader: str) -> Any:
    """Unpickle an envelope written by ``writer`` ("client"/"server") on ``reader``.

    ``PickleVersionError`` names both sides' versions when they differ; ``ValueError`` for
    something that is not an envelope. Nothing is unpickled in either case.
    """
    view = memoryview(data)
    if bytes(view[: len(PICKLE_MAGIC)]) != PICKLE_MAGIC:
        raise ValueError("not a KCoral pickle payload")
    end = bytes(view[len(PICKLE_MAGIC) : len(PICKLE_MAGIC) + 256]).find(b"\n")
    try:
        theirs = json.loads(bytes(view[len(PICKLE_MAGIC) : len(PICKLE_MAGIC) + end]))
    except ValueError:
        theirs = None
    if (
        end < 0
        or not isinstance(theirs, dict)
        or not all(isinstance(theirs.get(key), str) for key in ("python", "cloudpickle"))
    ):
        raise ValueError("malformed KCoral pickle payload header")
    ours = runtime_versions()
    if theirs != ours:
        raise PickleVersionError(
            "pickle serialization needs the same Python minor version and cloudpickle version "
            f"on both sides: {writer} has Python {theirs.get('python')} with cloudpickle "
            f"{theirs.get('cloudpickle')}, {reader} has Python {ours['python']} with "
            f"cloudpickle {ours['cloudpickle']}"
        )
    return pickle.loads(view[len(PICKLE_MAGIC) + end + 1 :])
