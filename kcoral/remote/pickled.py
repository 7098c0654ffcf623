"""Pickle-mode remote functions (EXTENSIONS §4): the call sent by value, and the server's
pickled values read back, only those a call asked for.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Callable, Mapping, Set
from typing import Any

from kcoral.by_value import modules_by_value
from kcoral.errors import ProtocolError
from kcoral.protocol.pickle_envelope import PickleVersionError, dump_envelope, load_envelope
from kcoral.remote.arguments import argument_labels


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
            reason = f"{type(exc).__name__}: {exc}"
            if isinstance(exc, RuntimeError) and "object on a CUDA device" in str(exc):
                # Not torch's advice (torch.load(map_location=...)): the caller calls no load.
                reason = (
                    "it holds a CUDA tensor and this machine has no CUDA; return it moved to "
                    "the CPU (tensor.cpu()) from the function"
                )
            raise ProtocolError(f"{what}: cannot unpickle {name!r}: {reason}") from exc
    return values


_BY_VALUE_LOCK = threading.Lock()


def dump_call(fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> bytes:
    return dump_by_value((fn, args, kwargs))


def unpicklable_part(
    fn: Callable[..., Any],
    bound: inspect.BoundArguments | None,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
) -> tuple[str, Exception] | None:
    """Which part of a call that failed to pickle is the cause, and its error: cloudpickle's
    own (``cannot pickle '_thread.lock' object``) named no argument, nor the function's
    globals. ``None`` when each part pickles alone."""
    if bound is None:
        labels = [f"argument {index}" for index in range(len(args))]
        values = [*args, *kwargs.values()]
    else:
        labels = argument_labels(bound, set(bound.arguments))
        values = [*bound.args, *bound.kwargs.values()]
        kwargs = bound.kwargs
    parts = [("the function (with the globals and closure it uses)", fn)]
    parts += zip(labels + [f"argument {name!r}" for name in kwargs], values, strict=True)
    for label, value in parts:
        try:
            dump_by_value(value)
        except Exception as exc:
            return label, exc
    return None


def dump_by_value(value: Any) -> bytes:
    """``dump_envelope(value)``, every loaded module the server cannot import by value.

    cloudpickle sends functions and classes of importable modules by reference, which the
    server cannot resolve for a user's script or helper module; registering those modules by
    value for this one dump sends the code itself ("by value", EXTENSIONS §4). Every such
    module, not only a remote function's own: a ``functools.partial`` of a helper function,
    or an argument (a ``%%kcoral -i`` value) whose class lives in a helper module, use it too.
    """
    import cloudpickle

    with _BY_VALUE_LOCK:
        registered = set(cloudpickle.list_registry_pickle_by_value())
        modules = [module for module in modules_by_value() if module.__name__ not in registered]
        for module in modules:
            cloudpickle.register_pickle_by_value(module)
        try:
            return dump_envelope(value)
        finally:
            for module in modules:
                cloudpickle.unregister_pickle_by_value(module)
