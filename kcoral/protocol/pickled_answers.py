"""Which pickled values in a server's answer the client unpickles (CLIENT_API.md §8).

Who can reach what (a malicious server): unpickling runs code, so only the values a call
asked for in pickle format are unpickled, and only once every name and payload has been
checked. ``kcoral.remote`` (remote functions) and the ``%%kcoral`` cells sent with pickle
come here.
"""

from __future__ import annotations

from collections.abc import Mapping, Set
from typing import Any

from kcoral.errors import ProtocolError
from kcoral.protocol.pickle_envelope import PickleVersionError, load_envelope


def load_requested(
    payloads: Mapping[str, object], allowed: Set[str], *, what: str
) -> dict[str, Any]:
    """Unpickle server envelopes, but only those under a name in ``allowed``.

    ``allowed`` is what this call asked for in pickle format (empty when it asked for none).
    Every name and every payload is checked before the first one is unpickled, so an answer
    carrying one name too many unpickles nothing: ``ProtocolError`` naming ``what`` (e.g.
    "request <id>") and the names. A payload that is not an envelope, or comes from other
    Python/cloudpickle versions, is a ``ProtocolError`` too.
    """
    if not isinstance(payloads, Mapping):
        raise ProtocolError(
            f"{what}: pickled values must be an object of names (one envelope each), not a "
            f"{type(payloads).__name__}; nothing was unpickled"
        )
    unexpected = sorted(str(name) for name in payloads if name not in allowed)
    if unexpected:
        raise ProtocolError(
            f"{what}: the server sent pickled values for {unexpected}, which this call did not "
            "ask for in pickle format; nothing was unpickled"
        )
    envelopes: dict[str, bytes] = {}
    for name, data in payloads.items():
        if not isinstance(data, bytes):
            raise ProtocolError(
                f"{what}: pickled value {name!r} is a {type(data).__name__}, not bytes; "
                "nothing was unpickled"
            )
        envelopes[name] = data
    values: dict[str, Any] = {}
    for name, data in envelopes.items():
        try:
            values[name] = load_envelope(data, writer="server", reader="client")
        except PickleVersionError as exc:
            raise ProtocolError(f"{what}: {exc}") from None
        except Exception as exc:  # e.g. a class the client cannot import, or no envelope
            if _is_cuda_on_a_machine_without_it(exc):
                raise ProtocolError(
                    f"{what}: cannot unpickle {name!r}: it holds a CUDA tensor and this "
                    "machine has no CUDA; return it moved to the CPU (tensor.cpu()) from the "
                    "function"
                ) from exc
            raise ProtocolError(
                f"{what}: cannot unpickle {name!r}: {type(exc).__name__}: {exc}"
            ) from exc
    return values


def _is_cuda_on_a_machine_without_it(error: Exception) -> bool:
    """Whether unpickling failed on a tensor pickled on a GPU, here without CUDA.

    torch's own message tells the reader to call ``torch.load(map_location=...)``, which a
    remote function's caller never calls: the fix is on the server's side of the call.
    """
    return isinstance(error, RuntimeError) and "deserialize object on a CUDA device" in str(error)
