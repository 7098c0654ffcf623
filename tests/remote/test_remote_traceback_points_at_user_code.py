"""A failed ``f.remote()`` shows the remote traceback at the user's own file and lines.

Before, the error printed only KCoral's local frames and ``runtime: ZeroDivisionError: ...``;
``.remote_traceback`` named ``<uploaded:H>`` lines (and the generated dispatcher) in JSON mode
and ``<dynamic-code>`` in pickle mode.
"""

from __future__ import annotations

import asyncio
import inspect
import sys

import pytest

import kcoral
import kcoral.remote
from kcoral.errors import RemoteExecutionError
from kcoral.remote.report import (
    JSON_DTYPE,
    JSON_ITERATOR,
    JSON_RETURN,
    NO_TRAMPOLINE,
    NOTE_HEADING,
    UNAWAITED,
    note_remote_traceback,
    user_traceback,
)
from kcoral.results import ProgramResult

pytestmark = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="exception notes (PEP 678) need Python 3.11"
)


def divide_by_nothing(x):
    y = x - x
    return x / y


def pick(values, index):
    return values[index]


def picks_through_a_helper(index):
    def inner(i):
        return pick([1, 2], i)

    return [inner(i) for i in [index]]


def line_of(fn, text: str) -> int:
    lines, first = inspect.getsourcelines(fn)
    return first + next(number for number, line in enumerate(lines) if text in line)


@pytest.fixture(scope="module")
def client(server_url: str):
    with kcoral.Client(server_url) as client:
        yield client


def the_note(error: RemoteExecutionError) -> str:
    notes = getattr(error, "__notes__", [])
    assert len(notes) == 1, notes
    return notes[0]


def test_a_json_mode_failure_names_the_users_file_and_line_and_hides_the_dispatcher(
    client,
) -> None:
    with pytest.raises(RemoteExecutionError) as info:
        client.function()(divide_by_nothing).remote(3)
    note = the_note(info.value)
    line = line_of(divide_by_nothing, "return x / y")
    assert note.startswith(NOTE_HEADING + "\n")
    assert f'File "{__file__}", line {line}, in divide_by_nothing\n    return x / y' in note
    assert "_kcoral_invoke" not in note and "<uploaded:" not in note
    assert note.endswith("ZeroDivisionError: division by zero")
    # the message and the raw server traceback stay as CLIENT_API §9 says
    assert str(info.value).endswith("failed: runtime: ZeroDivisionError: division by zero")
    assert "<uploaded:" in info.value.remote_traceback


def raises_its_own_error():
    class InnerError(Exception):
        pass

    raise InnerError("inner")


def test_an_exception_class_of_the_functions_own_is_named_as_the_user_wrote_it(client) -> None:
    # Before, the note's last line named the worker's module for the upload:
    # 'kcoral_uploaded_23_1.raises_its_own_error.<locals>.InnerError: inner'. The class
    # exists only on the server; the client reads its name, never unpickles it.
    with pytest.raises(RemoteExecutionError) as info:
        client.function()(raises_its_own_error).remote()
    assert the_note(info.value).endswith("\nraises_its_own_error.<locals>.InnerError: inner")
    assert str(info.value).endswith("failed: runtime: InnerError: inner")


def one_line(x): return 1 / x  # fmt: skip


def test_a_one_line_function_points_at_its_line(client) -> None:
    # its body is rewritten on upload; the frame kept the uploaded module's name and line
    with pytest.raises(RemoteExecutionError) as info:
        client.function()(one_line).remote(0)
    line = one_line.__code__.co_firstlineno
    assert f'File "{__file__}", line {line}, in one_line\n' in the_note(info.value)


def test_a_pickle_mode_failure_names_the_file_of_each_frame_with_its_source_line(
    client,
) -> None:
    with pytest.raises(RemoteExecutionError) as info:
        client.function(serialization="pickle")(picks_through_a_helper).remote(5)
    note = the_note(info.value)
    assert "<dynamic-code>" not in note
    for fn, name, text in [
        (picks_through_a_helper, "picks_through_a_helper", "return [inner(i)"),
        (picks_through_a_helper, "inner", "return pick([1, 2], i)"),
        (pick, "pick", "return values[index]"),
    ]:
        assert f'File "{__file__}", line {line_of(fn, text)}, in {name}\n    {text}' in note
    assert note.endswith("IndexError: list index out of range")


def test_a_run_async_call_gets_the_same_note(client) -> None:
    remote = client.function()(divide_by_nothing)
    with pytest.raises(RemoteExecutionError) as info:
        asyncio.run(remote.remote(3, run_async=True))
    assert f'File "{__file__}"' in the_note(info.value)


@pytest.mark.parametrize(
    "trampoline",
    [
        "from kcoral_server.worker.older_trampoline import call_pickled\n",  # an older KCoral
        "from kcoral_server_absent.trampoline import call_pickled\n",  # not a KCoral server
    ],
)
def test_a_pickle_call_to_a_server_without_the_trampoline_says_to_use_json(
    client, monkeypatch, trampoline
) -> None:
    # it said only "runtime: ModuleNotFoundError: No module named 'kcoral_server'"
    monkeypatch.setattr(kcoral.remote, "TRAMPOLINE_SOURCE", trampoline)
    with pytest.raises(RemoteExecutionError) as info:
        client.function(serialization="pickle")(pick).remote([1], 0)
    assert the_note(info.value) == NO_TRAMPOLINE
    assert "serialization='json'" in NO_TRAMPOLINE


def returns_a_set():
    return {"ids": {1, 2}}


def test_a_json_return_value_that_json_cannot_carry_says_what_to_return(client) -> None:
    # it said only "serialization: cannot encode value of type 'set'"
    with pytest.raises(RemoteExecutionError, match="cannot encode value of type 'set'") as info:
        client.function()(returns_a_set).remote()
    assert the_note(info.value) == JSON_RETURN
    assert "serialization='pickle'" in JSON_RETURN
    assert client.function(serialization="pickle")(returns_a_set).remote() == {"ids": {1, 2}}


def returns_a_generator():
    return (i * i for i in range(3))


def test_a_json_returned_generator_is_told_to_return_a_list_not_to_use_pickle(client) -> None:
    # remote-function soak: the note said "or use serialization='pickle'", which refuses a
    # generator too
    with pytest.raises(RemoteExecutionError, match="value of type 'generator'") as caught:
        client.function()(returns_a_generator).remote()
    assert the_note(caught.value) == JSON_ITERATOR
    assert "pickle" not in JSON_ITERATOR
    with pytest.raises(RemoteExecutionError, match="generator"):
        client.function(serialization="pickle")(returns_a_generator).remote()


def returns_nan():
    return float("nan")


def test_a_json_return_value_that_is_not_finite_is_not_called_a_float_json_carries(
    client,
) -> None:
    with pytest.raises(RemoteExecutionError, match="non-finite") as info:
        client.function()(returns_nan).remote()
    assert the_note(info.value) == JSON_RETURN
    assert "finite float" in JSON_RETURN  # it listed "float" as what to return


async def awaited_nowhere():
    return 1


def test_an_async_function_on_a_server_that_never_awaits_it_says_so() -> None:
    # a server without feature async-run returns the coroutine; the note said "return JSON
    # values", which an async def function returning 1 already does
    failure = {
        "kind": "serialization",
        "message": "cannot encode value of type 'coroutine'",
        "instruction_op": "return",
        "traceback": "",
    }
    result = ProgramResult("FAILED", "r", 0.0, 0.0, 0.0, 0.0, {}, "", "", False, False, failure)
    error = RemoteExecutionError(result)
    note_remote_traceback(error, awaited_nowhere, "json")
    assert the_note(error) == UNAWAITED


def test_a_traceback_that_is_not_pythons_passes_through_unchanged() -> None:
    text = 'odd text\n  File "x", line nope, in f\nValueError: v\n'
    assert user_traceback(text, lambda file, line, name: None) == text.rstrip("\n")


def test_a_version_mismatch_has_no_note_repeating_its_message(client, monkeypatch) -> None:
    # remote-function soak: under "Remote traceback (most recent call last), on the
    # server:" the note held no frame, only the message again
    from kcoral.protocol import pickle_envelope

    real = pickle_envelope.runtime_versions()
    monkeypatch.setattr(pickle_envelope, "runtime_versions", lambda: {**real, "python": "3.1"})
    with pytest.raises(RemoteExecutionError) as caught:
        client.function(serialization="pickle")(pick).remote([1], 0)
    assert "client has Python 3.1 with cloudpickle" in str(caught.value)
    assert getattr(caught.value, "__notes__", []) == []


def returns_a_lock():
    import threading

    return threading.Lock()


def test_a_pickle_result_that_cannot_be_pickled_has_no_note_of_kcorals_frames(client) -> None:
    # remote-function soak: the note held the trampoline's, the envelope's and
    # cloudpickle's frames, none of the user's, under a message that already said it all
    with pytest.raises(RemoteExecutionError) as caught:
        client.function(serialization="pickle")(returns_a_lock).remote()
    assert "serialization: cannot pickle the result (lock): TypeError: cannot pickle" in str(
        caught.value
    )
    assert getattr(caught.value, "__notes__", []) == []


def returns_complex():
    import numpy as np

    return np.ones(2, dtype=np.complex64)


def test_a_json_returned_array_of_a_dtype_the_wire_lacks_is_not_told_to_return_arrays(
    client,
) -> None:
    # remote-function soak: the note said "return ... bytes or arrays", to a function that
    # had returned an array
    with pytest.raises(RemoteExecutionError) as caught:
        client.function()(returns_complex).remote()
    assert "cannot encode an array of dtype 'complex64'" in str(caught.value)
    assert the_note(caught.value) == JSON_DTYPE
    assert "complex" not in JSON_DTYPE and "bfloat16, float8_e4m3fn, float8_e5m2;" in JSON_DTYPE
