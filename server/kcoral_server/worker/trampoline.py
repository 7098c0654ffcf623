"""The call trampoline of pickle-mode remote functions (EXTENSIONS.md §4).

A pickle-mode program uploads ``from kcoral_server.worker.trampoline import call_pickled`` and
runs ``call_pickled(payload)``: the payload is a KCoral pickle envelope of
``(function, args, kwargs)``; the result goes back as an envelope (``bytes``).

The admitted format is read from the worker's request context
(``kcoral_server.worker.context``, set by the engine from ``RunProgram.serialization``).
Nothing is unpickled unless the request was admitted with ``pickle``: an operator who
allows only ``json`` gets no pickle payloads, even from hand-written programs.
"""

from __future__ import annotations

import inspect
from typing import Any

from kcoral.protocol.errors import ExecutionError


def admitted_serialization() -> str | None:
    """The format the running request was admitted with (``None``: no header, no request)."""
    from kcoral_server.worker import context

    request = context.current_request()
    return None if request is None else request.serialization


def call_pickled(payload: bytes) -> Any:
    """Unpickle ``(fn, args, kwargs)``, call it, and return the pickled result.

    For an ``async def`` function (or any call returning an awaitable) this returns a
    coroutine, which the worker awaits on its own loop (EXTENSIONS.md §3).
    """
    if admitted_serialization() != "pickle":
        raise ExecutionError(
            "unavailable",
            "refusing to unpickle: this request was not admitted with "
            "X-KCoral-Serialization: pickle",
        )
    if not isinstance(payload, (bytes, bytearray, memoryview)):
        raise ExecutionError("runtime", "call_pickled expects the bytes payload upload")
    # Imported here, so workers that never see a pickle call do not pay for it; and from the
    # envelope's own module, not kcoral.remote, whose client-side imports cost a fresh worker
    # 35-50 ms a call.
    from kcoral.protocol.pickle_envelope import PickleVersionError, dump_envelope, load_envelope

    try:
        call = load_envelope(payload, writer="client", reader="server")
    except ModuleNotFoundError as exc:
        if exc.name == "cloudpickle":
            raise ExecutionError(
                "unavailable", "cloudpickle is not installed on the server"
            ) from None
        raise _unpickling_failed(exc) from exc
    except PickleVersionError as exc:
        raise ExecutionError("runtime", str(exc)) from None
    except Exception as exc:
        raise _unpickling_failed(exc) from exc
    if not (isinstance(call, tuple) and len(call) == 3 and callable(call[0])):
        raise ExecutionError("runtime", "pickle payload is not a (function, args, kwargs) call")
    fn, args, kwargs = call

    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        return _finish(result, dump_envelope)
    return _dump_result(result, dump_envelope)


async def _finish(awaitable: Any, dump: Any) -> bytes:
    return _dump_result(await awaitable, dump)


def _dump_result(result: Any, dump: Any) -> bytes:
    try:
        return dump(result)
    except Exception as exc:
        raise ExecutionError(
            "serialization",
            f"cannot pickle the result ({type(result).__name__}): {type(exc).__name__}: {exc}",
        ) from exc


def _unpickling_failed(exc: BaseException) -> ExecutionError:
    return ExecutionError(
        "runtime", f"cannot unpickle the remote call: {type(exc).__name__}: {exc}"
    )
