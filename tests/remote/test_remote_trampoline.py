"""The server-side pickle trampoline, run in-process with a stand-in request context."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading

import pytest
from kcoral_server.worker import context, trampoline

from kcoral.protocol.errors import ExecutionError
from kcoral.protocol.pickle_envelope import PICKLE_MAGIC, dump_envelope, load_envelope


@pytest.fixture
def admitted(monkeypatch: pytest.MonkeyPatch):
    def admit(serialization: str | None) -> None:
        request = context.RequestContext(
            request_id="r",
            device="cpu",
            workspace="/tmp",
            serialization=serialization,
            allowed_serialization=("json", "pickle"),
        )
        monkeypatch.setattr(context, "current", request)

    return admit


def result_of(payload: bytes):
    return load_envelope(trampoline.call_pickled(payload), writer="server", reader="client")


def test_a_pickled_call_runs_and_its_result_comes_back_pickled(admitted) -> None:
    admitted("pickle")
    scale = 3
    assert result_of(dump_envelope((lambda x, k=0: x * scale + k, (2,), {"k": 1}))) == 7


@pytest.mark.parametrize("serialization", [None, "json"])
def test_nothing_is_unpickled_unless_the_request_was_admitted_with_pickle(
    admitted, serialization
) -> None:
    admitted(serialization)
    unpickled = []

    class Trap:
        def __reduce__(self):
            return (unpickled.append, (1,))

    with pytest.raises(ExecutionError) as info:
        trampoline.call_pickled(dump_envelope(Trap()))
    assert info.value.kind == "unavailable"
    assert unpickled == []


def test_outside_a_request_nothing_is_unpickled(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(context, "current", None)
    with pytest.raises(ExecutionError):
        trampoline.call_pickled(dump_envelope((print, (), {})))


def test_a_version_mismatch_is_a_runtime_error_naming_both_sides(admitted) -> None:
    admitted("pickle")
    payload = dump_envelope((print, (), {}))
    end = payload.index(b"\n", len(PICKLE_MAGIC))
    forged = PICKLE_MAGIC + json.dumps({"python": "3.99", "cloudpickle": "9.9"}).encode()
    with pytest.raises(ExecutionError) as info:
        trampoline.call_pickled(forged + payload[end:])
    assert info.value.kind == "runtime"
    assert "client has Python 3.99 with cloudpickle 9.9" in info.value.message
    assert "server has Python" in info.value.message


def test_garbage_is_a_clear_runtime_error(admitted) -> None:
    admitted("pickle")
    with pytest.raises(ExecutionError, match=r"unpickle|pickle payload") as info:
        trampoline.call_pickled(PICKLE_MAGIC + b'{"x": 1}\n' + b"garbage")
    assert info.value.kind == "runtime"


def test_an_async_function_yields_an_awaitable_giving_the_pickled_result(admitted) -> None:
    admitted("pickle")

    async def slow_double(x):
        await asyncio.sleep(0)
        return x * 2

    awaitable = trampoline.call_pickled(dump_envelope((slow_double, (21,), {})))
    pickled = asyncio.run(awaitable)
    assert load_envelope(pickled, writer="server", reader="client") == 42


def test_an_unpicklable_result_is_a_serialization_error(admitted) -> None:
    admitted("pickle")
    with pytest.raises(ExecutionError) as info:
        trampoline.call_pickled(dump_envelope((threading.Lock, (), {})))
    assert info.value.kind == "serialization"


def test_an_exception_of_the_function_propagates_unchanged(admitted) -> None:
    admitted("pickle")

    def fails():
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        trampoline.call_pickled(dump_envelope((fails, (), {})))


def test_a_pickled_call_imports_none_of_the_client_side_modules() -> None:
    # The envelope came from kcoral.remote, whose imports (the program builder, the
    # connection code) cost a fresh worker 35-50 ms, most of a pickle call's server time.
    script = (
        "import operator, sys\n"
        "from kcoral_server.worker import context, trampoline\n"
        "from kcoral.protocol.pickle_envelope import dump_envelope\n"
        "context.current = context.RequestContext(request_id='r', device='cpu',"
        " workspace='/tmp', serialization='pickle', allowed_serialization=('pickle',))\n"
        "trampoline.call_pickled(dump_envelope((operator.add, (1, 2), {})))\n"
        "print(sorted(m for m in ('kcoral.remote', 'kcoral.program', 'kcoral.connection')"
        " if m in sys.modules))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
