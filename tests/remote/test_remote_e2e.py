"""Remote functions against a real CPU server (JSON and pickle modes, async calls)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import json
import operator
import time
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest
import remote_samples as samples

import kcoral
from kcoral.errors import KCoralError, ProtocolError, RemoteExecutionError
from kcoral.protocol.pickle_envelope import PICKLE_MAGIC, dump_envelope
from kcoral.remote import TRAMPOLINE_SOURCE


@pytest.fixture(scope="module")
def client(server_url: str):
    with kcoral.Client(server_url) as client:
        yield client


def test_every_json_argument_type_round_trips(client) -> None:
    echo = client.function()(samples.echo)
    values = [None, True, -3, 2.5, "text é", [1, [2, {"a": None}]], {"k": [True, 1.0]}]
    assert echo.remote(*values, key={"$ref": "module"}) == [values, {"key": {"$ref": "module"}}]


def test_whole_binary_arguments_arrive_as_bytes_and_arrays(client) -> None:
    def describe(data, array, half, view):
        import numpy

        return [
            data,
            bytes(view),
            type(array).__name__,
            str(array.dtype),
            numpy.asarray(array).tolist() if hasattr(array, "tolist") else None,
            str(half.dtype),
        ]

    # defined inside the test (no closure): still captured from this file
    remote = client.function()(describe)
    array = np.arange(6, dtype=np.int32).reshape(2, 3)
    half = np.ones(2, dtype=ml_dtypes.bfloat16)
    data, view, kind, dtype, values, half_dtype = remote.remote(
        bytearray(b"ab"), array, half, memoryview(b"mv")
    )
    assert (data, view) == (b"ab", b"mv")
    assert kind in ("Tensor", "ndarray") and dtype.endswith("int32")
    assert values == array.tolist()
    assert half_dtype.endswith("bfloat16")


def test_arrays_and_bytes_come_back_decoded(client) -> None:
    def produce(n):
        import numpy

        return numpy.arange(n, dtype=numpy.float32) * 2

    result = client.function()(produce).remote(3)
    assert isinstance(result, np.ndarray) and result.tolist() == [0.0, 2.0, 4.0]


def test_defaults_are_bound_on_the_client_and_keywords_reach_the_function(client) -> None:
    remote = client.function()(samples.scaled_sum)
    assert remote.remote(1, 2, 3, z=1) == {"total": 12, "extra": ["z"], "mean": 1.5}
    assert remote.remote(1) == {"total": 7.0, "extra": [], "mean": 1.5}


def test_execute_returns_the_program_result_with_output(client) -> None:
    result = client.function()(samples.factorial).execute(5)
    assert result.completed and result["output"] == 120


def test_a_remote_exception_is_a_remote_execution_error_with_the_remote_traceback(client) -> None:
    with pytest.raises(RemoteExecutionError) as info:
        client.function()(samples.factorial).remote("x")
    error = info.value
    assert error.result.error["kind"] == "runtime"
    assert "TypeError" in str(error)
    assert "in factorial" in error.remote_traceback
    assert "n <= 1" in error.remote_traceback


def test_an_assertion_in_a_remote_function_is_a_correctness_failure(client) -> None:
    # (in a helper module: pytest rewrites asserts of test files into outside globals)
    with pytest.raises(RemoteExecutionError) as info:
        client.function()(samples.positive).remote(-1)
    assert info.value.result.error["kind"] == "correctness"


def test_pickle_mode_sends_closures_lambdas_and_local_objects(client) -> None:
    offset = 10

    def add_offset(x):
        return x + offset

    @dataclasses.dataclass
    class Point:
        x: int
        y: int

        def norm1(self):
            return abs(self.x) + abs(self.y)

    assert client.function(serialization="pickle")(add_offset).remote(5) == 15
    assert client.function(serialization="pickle")(lambda p: p.norm1()).remote(Point(3, -4)) == 7
    moved = client.function(serialization="pickle")(lambda p: Point(p.x + 1, p.y))
    assert moved.remote(Point(1, 2)) == Point(2, 2)
    total = client.function(serialization="pickle")(lambda a: (a * 2, a.dtype.name))
    doubled, dtype = total.remote(np.arange(4, dtype=np.float64))
    assert doubled.tolist() == [0.0, 2.0, 4.0, 6.0] and dtype == "float64"


def test_standard_library_callables_and_partials_work_in_pickle_mode(client) -> None:
    # Their modules once went by value too, which cannot copy them (json's encoder class,
    # functools' and operator's C types): the call failed before or after it was sent.
    pickled = client.function(serialization="pickle")
    assert pickled(json.dumps).remote({"a": 1}) == '{"a": 1}'
    assert pickled(operator.itemgetter(1)).remote(["a", "b"]) == "b"
    assert pickled(functools.partial(pow, 2)).remote(10) == 1024
    assert pickled(functools.partial(lambda a, b: a - b, 5)).remote(2) == 3


def test_pickle_mode_sends_the_helper_modules_that_partials_and_arguments_reference(client):
    # Only the function's own module went by value: a partial of a helper module's function,
    # or an argument of a helper module's class, failed on the server with
    # "cannot unpickle the remote call: ModuleNotFoundError: No module named 'remote_samples'".
    pickled = client.function(serialization="pickle")
    assert pickled(functools.partial(samples.factorial, 5)).remote() == 120
    assert pickled(lambda pair: pair.total()).remote(samples.Pair(2, 3)) == 5
    assert pickled(lambda fn, n: fn(n)).remote(samples.factorial, 4) == 24


def test_the_serialization_can_change_per_call(client) -> None:
    remote = client.function()(samples.factorial)
    assert remote.remote(4, serialization="pickle") == 24
    assert remote.remote(4, serialization="json") == 24


def test_a_pickle_mode_exception_carries_the_remote_traceback(client) -> None:
    def explode():
        raise RuntimeError("kaboom")

    with pytest.raises(RemoteExecutionError, match="kaboom") as info:
        client.function(serialization="pickle")(explode).remote()
    assert "explode" in info.value.remote_traceback


def test_an_async_def_function_can_be_called_both_ways(client, server_url: str) -> None:
    remote = client.function()(samples.doubled)
    assert remote.remote(21) == 42

    async def main():
        return await remote.remote(5, run_async=True)

    assert asyncio.run(main()) == 10

    async def with_async_client():
        async with kcoral.AsyncClient(server_url) as async_client:
            pickled = async_client.function(serialization="pickle")(samples.doubled)
            return await pickled.remote(4, run_async=True), pickled.remote(3)

    # the blocking call inside a running loop must not try to start a loop there
    assert asyncio.run(with_async_client()) == (8, 6)


def test_a_blocking_call_works_inside_a_running_event_loop(client) -> None:
    remote = client.function()(samples.factorial)

    async def notebook_cell():
        return remote.remote(3)

    assert asyncio.run(notebook_cell()) == 6


def _wait_for_go(directory):
    import os
    import time

    deadline = time.monotonic() + 60
    while not os.path.exists(os.path.join(directory, "go")) and time.monotonic() < deadline:
        time.sleep(0.02)
    return directory


async def _max_in_progress(async_client, calls, go: Path, wanted: int) -> int:
    """Run ``calls`` (each blocked until ``go`` exists) while sampling the server's own
    requests_in_progress counter; release them once ``wanted`` ran at once (or after 60 s)."""
    seen = 0
    tasks = asyncio.gather(*calls)
    deadline = time.monotonic() + 60
    while seen < wanted and time.monotonic() < deadline and not tasks.done():
        health = await async_client.health()
        seen = max(seen, health["load"]["requests_in_progress"])
        await asyncio.sleep(0.05)
    go.touch()
    await tasks
    return seen


@pytest.mark.slow
def test_concurrent_awaits_overlap_on_the_server(server_url: str, tmp_path: Path) -> None:
    async def main():
        async with kcoral.AsyncClient(server_url) as async_client:
            waiter = async_client.function()(_wait_for_go)
            calls = [waiter.remote(str(tmp_path), run_async=True) for _ in range(8)]
            return await _max_in_progress(async_client, calls, tmp_path / "go", 4)

    assert asyncio.run(main()) == 4  # 8 calls on the 4-worker server: 4 ran at once


@pytest.mark.slow
def test_run_async_calls_of_a_sync_client_overlap_too(client, server_url, tmp_path) -> None:
    async def main():
        async with kcoral.AsyncClient(server_url) as async_client:
            waiter = client.function()(_wait_for_go)
            calls = [waiter.remote(str(tmp_path), run_async=True) for _ in range(4)]
            return await _max_in_progress(async_client, calls, tmp_path / "go", 4)

    assert asyncio.run(main()) == 4


def test_the_async_client_mirrors_the_sync_client(server_url: str) -> None:
    async def main():
        async with kcoral.AsyncClient(server_url) as async_client:
            health = await async_client.health()
            with pytest.raises(ProtocolError):
                await async_client.target()
            program = kcoral.Program()
            data = program.upload(kind="bytes", value=b"x" * 1000)
            program.return_(key="data", value=data)
            first = await async_client.execute(program, timeout_seconds=30)
            second = await async_client.execute(program)  # blob now cached server-side
            return health, first, second

    health, first, second = asyncio.run(main())
    assert health["status"] == "ok"
    assert first["data"] == second["data"] == b"x" * 1000


def test_the_async_client_reports_an_unreachable_server_as_a_transport_error() -> None:
    async def main():
        await kcoral.AsyncClient("http://127.0.0.1:9", connect_timeout_seconds=2).health()

    with pytest.raises(kcoral.TransportError):
        asyncio.run(main())


def _pickle_program(payload: bytes) -> kcoral.Program:
    program = kcoral.Program()
    module = program.upload(id="module", kind="module", source=TRAMPOLINE_SOURCE)
    function = program.get_function(id="function", module=module, name="call_pickled")
    argument = program.upload(id="payload", kind="bytes", value=payload)
    output = program.run(id="output", fn=function, args=[argument])
    program.return_(key="output", value=output)
    return program


def test_the_trampoline_refuses_to_unpickle_without_the_pickle_header(client) -> None:
    result = client.execute(_pickle_program(dump_envelope((print, ("hi",), {}))))
    assert result.status == "FAILED" and result.error["kind"] == "unavailable"
    assert result.stdout == ""


def test_a_version_mismatch_is_a_clear_runtime_failure(client) -> None:
    payload = dump_envelope((print, (), {}))
    end = payload.index(b"\n", len(PICKLE_MAGIC))
    header = json.dumps({"python": "3.1", "cloudpickle": "0.0.1"}).encode()
    program = _pickle_program(PICKLE_MAGIC + header + payload[end:])
    result = client.execute(program, serialization="pickle")
    assert result.error["kind"] == "runtime"
    assert "client has Python 3.1 with cloudpickle 0.0.1" in result.error["message"]
    assert "server has Python" in result.error["message"]


def test_a_disallowed_format_is_refused_and_the_server_keeps_serving(
    json_only_server_url: str,
) -> None:
    with kcoral.Client(json_only_server_url) as client:
        pickled = client.function(serialization="pickle")(lambda: 1)
        with pytest.raises(KCoralError) as info:
            pickled.remote()
        assert info.value.status_code == 400
        assert info.value.kind == "parse"
        assert info.value.message == (
            "Serialization format 'pickle' not allowed. Allowed formats: ['json']"
        )
    # A fresh client: the refusal comes before the body is read, so the server drops that
    # connection (without saying `Connection: close`; reported to the front-end owner).
    with kcoral.Client(json_only_server_url) as client:
        assert client.function()(samples.factorial).remote(3) == 6


def test_an_unknown_format_header_is_a_400(server_url: str) -> None:
    with kcoral.Client(server_url, headers={"X-KCoral-Serialization": "yaml"}) as client:
        with pytest.raises(KCoralError) as info:
            client.execute(_pickle_program(b""))
        assert info.value.status_code == 400 and info.value.kind == "parse"
