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


def dump_envelope(value: Any) -> bytes:
    """``value`` pickled by cloudpickle behind a header naming this side's versions."""
    import cloudpickle

    header = json.dumps(runtime_versions(), sort_keys=True).encode("ascii")
    pickled: bytes = cloudpickle.dumps(value)
    return PICKLE_MAGIC + header + b"\n" + pickled


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
