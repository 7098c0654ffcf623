"""Programs built by remote functions, argument rules and the pickle envelope."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import numpy as np
import pytest
import remote_samples as samples

from kcoral.protocol.pickle_envelope import (
    PICKLE_MAGIC,
    PickleVersionError,
    dump_envelope,
    load_envelope,
)
from kcoral.remote import TRAMPOLINE_SOURCE, RemoteFunction
from kcoral.remote.pickled import dump_by_value


def make(fn, **options):
    return RemoteFunction(fn, client=object(), **options)


def test_a_json_call_builds_the_documented_program_shape() -> None:
    program = make(samples.scaled_sum, cpu_only=True).build_program(1, y=2.0, extra=True)
    ops = program.instructions
    assert [i["op"] for i in ops] == ["upload", "get_function", "run", "return"]
    assert ops[0]["id"] == "module" and ops[0]["kind"] == "module"
    assert ops[1] == {
        "op": "get_function",
        "id": "function",
        "module": {"$ref": "module"},
        "name": "_kcoral_invoke_scaled_sum",
        "cpu_only": True,
    }
    # defaults bound client-side: y given, scale from its default, **extra by name
    assert ops[2] == {
        "op": "run",
        "id": "output",
        "fn": {"$ref": "function"},
        "args": [
            2,
            ["scale", "extra"],
            [True, True, True, True],
            {"value": 1},
            {"value": 2.0},
            {"value": 2},
            {"value": True},
        ],
    }
    assert ops[3] == {"op": "return", "key": "output", "value": {"$ref": "output"}}


def test_binary_arguments_are_uploaded_under_their_bound_position() -> None:
    array = np.arange(4, dtype=np.float32)
    program = make(samples.echo).build_program("a", b"raw", array, k=bytearray(b"kw"))
    uploads = {i["id"]: i for i in program.instructions if i["op"] == "upload"}
    assert uploads["arg_1"]["kind"] == "bytes"
    assert uploads["arg_2"]["kind"] == "tensor" and uploads["arg_2"]["shape"] == [4]
    assert uploads["arg_3"]["kind"] == "bytes"
    run = next(i for i in program.instructions if i["op"] == "run")
    assert run["args"] == [
        3,
        ["k"],
        [True, False, False, False],
        {"value": "a"},
        {"$ref": "arg_1"},
        {"$ref": "arg_2"},
        {"$ref": "arg_3"},
    ]


def test_reference_shaped_arguments_stay_literal() -> None:
    program = make(samples.echo).build_program({"$ref": "module"})
    run = next(i for i in program.instructions if i["op"] == "run")
    assert run["args"][3] == {"value": {"$ref": "module"}}


@pytest.mark.parametrize(
    ("value", "error"),
    [
        ((1, 2), TypeError),
        ({1: "x"}, TypeError),
        ([b"nested"], TypeError),
        ({"a": np.zeros(2)}, TypeError),
        (np.float64(1.0), TypeError),
        (object(), TypeError),
        (float("nan"), ValueError),
        ([float("inf")], ValueError),
    ],
)
def test_values_that_are_not_json_are_rejected(value, error) -> None:
    with pytest.raises(error):
        make(samples.echo).build_program(value)


def test_subclasses_of_json_types_are_rejected() -> None:
    class MyInt(int):
        pass

    class MyDict(dict):
        pass

    for value in (MyInt(1), MyDict(), [MyInt(2)]):
        with pytest.raises(TypeError):
            make(samples.echo).build_program(value)


def test_a_cycle_is_a_value_error() -> None:
    cyclic: list = []
    cyclic.append(cyclic)
    with pytest.raises(ValueError, match="cycle"):
        make(samples.echo).build_program(cyclic)


@pytest.mark.parametrize("wrap", [lambda inner: [inner], lambda inner: {"a": inner}])
def test_an_argument_nested_too_deeply_is_a_value_error_naming_it(wrap) -> None:
    # Fuzz audit: 5,000 levels raised a bare RecursionError from the JSON check.
    deep: object = 1
    for _ in range(5_000):
        deep = wrap(deep)
    with pytest.raises(ValueError, match="argument 'value' is nested too deeply"):
        make(samples.echo).build_program(value=deep)
    with pytest.raises(ValueError, match=r"argument 'args'\[0\] is nested too deeply"):
        make(samples.echo).build_program(deep)


def test_a_value_json_cannot_carry_is_named_by_its_parameter_and_a_default_as_such() -> None:
    # remote-function soak: a tuple default was "argument 1 is a tuple", for a call that
    # passed one argument
    with pytest.raises(TypeError, match=r"^argument 'pair' \(its default\) is of type tuple"):
        make(samples.with_tuple_default).build_program(1)
    with pytest.raises(TypeError, match=r"^argument 'pair' is of type set"):
        make(samples.with_tuple_default).build_program(1, {2})
    with pytest.raises(TypeError, match=r"^argument 'args'\[1\] is of type tuple"):
        make(samples.echo).build_program(1, (2, 3))
    # a lone surrogate failed later as "cannot encode the request ... position 621"
    with pytest.raises(
        ValueError, match=r"^argument 'pair'\[1\] holds a lone surrogate at position 1"
    ):
        make(samples.with_tuple_default).build_program(1, ["ok", "a\udc80"])
    with pytest.raises(ValueError, match=r"^a key of argument 'x' holds a lone surrogate"):
        make(samples.with_tuple_default).build_program({"\udc80": 1})


def test_a_lone_surrogate_in_an_argument_reads_as_a_programs_builder_says_it() -> None:
    # one check for both (kcoral.protocol.utf8_text): the remote call's words had their own
    # shape, "...; UTF-8 cannot carry it (...)", beside the builder's "..., which UTF-8 ..."
    with pytest.raises(ValueError) as refused:
        make(samples.with_tuple_default).build_program(1, ["ok", "a\udc80"])
    assert str(refused.value) == (
        "argument 'pair'[1] holds a lone surrogate at position 1 ('\\udc80'), which UTF-8 "
        "cannot carry (bytes travel as bytes arguments)"
    )


def test_an_array_json_mode_cannot_send_names_the_argument_the_dtypes_and_pickle() -> None:
    # remote-function soak: it said "dtype 'complex64' is not one of the protocol dtypes",
    # naming neither the argument, nor those dtypes, nor pickle
    wire = "bool, uint8, int8, int16, int32, int64, float16, float32, float64, bfloat16, "
    wire += "float8_e4m3fn, float8_e5m2"
    with pytest.raises(ValueError) as caught:
        make(samples.with_tuple_default).build_program(1, np.ones(2, dtype=np.complex64))
    assert str(caught.value) == (
        f"argument 'pair': dtype 'complex64' is not a wire dtype ({wire}); "
        "use serialization='pickle'"
    )


def test_a_shared_but_acyclic_list_is_fine() -> None:
    shared = [1]
    make(samples.echo).build_program([shared, shared])


def test_arguments_that_do_not_bind_are_a_type_error() -> None:
    with pytest.raises(TypeError):
        make(samples.factorial).build_program()
    with pytest.raises(TypeError):
        make(samples.factorial).build_program(1, 2)
    with pytest.raises(TypeError):
        make(samples.factorial, serialization="pickle").build_program(1, m=2)


def test_a_pickle_call_uploads_one_payload_for_the_trampoline() -> None:
    offset = 3
    remote = make(lambda x: x + offset, serialization="pickle")
    program = remote.build_program(4)
    ops = program.instructions
    assert ops[0]["source"] == TRAMPOLINE_SOURCE
    assert ops[1]["name"] == "call_pickled"
    payload_upload = ops[2]
    assert payload_upload["id"] == "payload" and payload_upload["kind"] == "bytes"
    payload = program.blobs[payload_upload["blob"]]
    fn, args, kwargs = load_envelope(payload, writer="client", reader="server")
    assert fn(*args, **kwargs) == 7


def test_the_serialization_can_be_overridden_per_program() -> None:
    remote = make(samples.factorial)
    program = remote.build_program(3, serialization="pickle")
    assert program.instructions[0]["source"] == TRAMPOLINE_SOURCE
    with pytest.raises(ValueError):
        make(lambda x: x, serialization="pickle").build_program(1, serialization="json")


def test_a_version_mismatch_names_both_sides_and_unpickles_nothing() -> None:
    payload = dump_envelope(1)
    header_end = payload.index(b"\n", len(PICKLE_MAGIC))
    forged = (
        PICKLE_MAGIC
        + json.dumps({"python": "2.7", "cloudpickle": "0.1"}).encode()
        + payload[header_end:]
    )
    with pytest.raises(PickleVersionError) as info:
        load_envelope(forged, writer="client", reader="server")
    message = str(info.value)
    assert "client has Python 2.7 with cloudpickle 0.1" in message
    assert f"server has Python {sys.version_info.major}.{sys.version_info.minor}" in message


def test_something_that_is_not_an_envelope_is_refused() -> None:
    with pytest.raises(ValueError, match="not a KCoral pickle payload"):
        load_envelope(b"\x80\x04K\x01.", writer="client", reader="server")


def test_a_self_calling_pickled_function_does_not_drag_its_client_along() -> None:
    namespace: dict = {}
    remote = RemoteFunction(
        lambda n: 1 if n <= 1 else n * namespace["fact"](n - 1),
        client=threading.Lock(),  # unpicklable, like a real client's sockets
        serialization="pickle",
    )
    namespace["fact"] = remote  # the function reaches its RemoteFunction through a global
    program = remote.build_program(3)
    payload = program.blobs[program.instructions[2]["blob"]]
    fn, args, _ = load_envelope(payload, writer="client", reader="server")
    assert fn(*args) == 6


def test_json_mode_never_imports_cloudpickle() -> None:
    code = (
        "import sys, kcoral\n"
        "from kcoral.remote import RemoteFunction\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "import remote_samples\n"
        "RemoteFunction(remote_samples.factorial, client=None).build_program(3)\n"
        "assert 'cloudpickle' not in sys.modules, 'cloudpickle imported'\n"
        "assert 'tornado' not in sys.modules, 'tornado imported'\n"
    )
    directory = str(__import__("pathlib").Path(__file__).parent)
    subprocess.run([sys.executable, "-c", code, directory], check=True, timeout=60)


def test_a_helper_module_loaded_after_a_first_call_is_sent_by_value_too(tmp_path) -> None:
    # The modules sent by value are worked out again only when sys.modules changes; one
    # loaded after the first pickle-mode call must still travel by value.
    dump_by_value((samples.scaled_sum, (1,), {}))
    helper = tmp_path / "late_helper_module.py"
    helper.write_text("def triple(x):\n    return 3 * x\n")
    sys.path.insert(0, str(tmp_path))
    try:
        import late_helper_module  # type: ignore[import-not-found]

        data = dump_by_value((late_helper_module.triple, (2,), {}))
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("late_helper_module", None)
    # Loaded where the helper module cannot be imported: only a copy by value works there.
    script = (
        "import sys; from kcoral.remote import load_envelope; "
        "fn, args, _ = load_envelope(sys.stdin.buffer.read(), writer='client', reader='server'); "
        "print(fn(*args))"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], input=data, capture_output=True, cwd="/", timeout=60
    )
    assert done.stdout.strip() == b"6", done.stderr
