"""Program builder rules (CLIENT_API.md §3, §5): ids, atomicity, snapshots, validation."""

from __future__ import annotations

import copy
import hashlib
import math

import numpy as np
import pytest

from kcoral import Program, Register
from kcoral.protocol.errors import ValidationError


def module(program, **kwargs):
    return program.upload(kind="module", source="def f(x):\n    return x\n", **kwargs)


def snapshot(program):
    return copy.deepcopy(program.instructions), dict(program.blobs)


def test_generated_ids_share_one_counter_and_skip_taken_names():
    program = Program()
    assert program.upload(kind="bytes", value=b"a").id == "upload_0"
    mod = module(program, id="mod")
    fn = program.get_function(module=mod, name="f")
    assert fn.id == "get_function_1"
    program.upload(kind="bytes", value=b"b", id="run_2")
    assert program.run(fn=fn).id == "run_3"
    assert program.upload(kind="bytes", value=b"c").id == "upload_4"


def test_explicit_ids_must_be_new_non_empty_strings():
    program = Program()
    module(program, id="m")
    for bad in ("", 3, "m"):
        with pytest.raises(ValueError):
            module(program, id=bad)
    assert len(program.instructions) == 1


def test_a_raising_call_changes_nothing_and_consumes_no_id():
    program = Program()
    mod = module(program)
    before = snapshot(program)
    with pytest.raises(TypeError):
        program.upload(kind="tensor", value=object())
    with pytest.raises(ValueError):
        program.run(fn=Register("nope"))
    with pytest.raises(ValueError):
        program.upload_file(blob=b"x", path="../x")
    with pytest.raises(TypeError):
        program.run(fn=mod, args=[[Register("upload_0")]])
    assert snapshot(program) == before
    assert program.upload(kind="bytes", value=b"x").id == "upload_1"


def test_module_uploads_send_language_only_for_cuda():
    program = Program()
    module(program, id="py")
    program.upload(kind="module", source="__global__ void k() {}", language="cuda", id="cu")
    py, cu = program.instructions
    assert py == {
        "op": "upload",
        "id": "py",
        "kind": "module",
        "source": "def f(x):\n    return x\n",
    }
    assert cu["language"] == "cuda"


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"kind": "file", "value": b"x"}, ValueError),
        ({"kind": "blob"}, ValueError),
        ({"kind": "module"}, TypeError),
        ({"kind": "module", "source": b"x"}, TypeError),
        ({"kind": "module", "source": "x", "value": b"x"}, TypeError),
        ({"kind": "module", "source": "x", "dtype": "uint8"}, TypeError),
        ({"kind": "module", "source": "x", "language": "rust"}, ValueError),
        ({"kind": "bytes", "value": "text"}, TypeError),
        ({"kind": "bytes", "value": b"x", "source": "s"}, TypeError),
        ({"kind": "bytes", "value": b"x", "shape": [1]}, TypeError),
        ({"kind": "bytes", "value": b"x", "language": "cuda"}, TypeError),
        ({"kind": "library", "value": None}, TypeError),
        ({"kind": "tensor"}, TypeError),
        ({"kind": "tensor", "value": np.zeros(1), "source": "s"}, TypeError),
    ],
)
def test_upload_arguments_are_validated(kwargs, error):
    program = Program()
    with pytest.raises(error):
        program.upload(**kwargs)
    assert program.instructions == []


def test_bytes_and_tensor_values_are_snapshotted_and_deduplicated():
    program = Program()
    data = bytearray(b"hello")
    array = np.arange(3, dtype=np.int32)
    program.upload(kind="bytes", value=data)
    program.upload(kind="tensor", value=array)
    program.upload(kind="library", value=memoryview(b"hello"))
    data[0] = ord("j")
    array[0] = 99
    digest = hashlib.sha256(b"hello").hexdigest()
    tensor_digest = program.instructions[1]["blob"]
    assert list(program.blobs) == [digest, tensor_digest]  # shared blob, first-reference order
    assert program.instructions[2]["blob"] == digest
    assert program.blobs[digest] == b"hello"
    assert np.frombuffer(program.blobs[tensor_digest], "<i4").tolist() == [0, 1, 2]
    assert program.instructions[1]["shape"] == [3] and program.instructions[1]["dtype"] == "int32"


def test_upload_file_normalizes_the_path_and_refuses_conflicts():
    program = Program()
    reg = program.upload_file(blob=b"hi", path="./inputs//hello.txt")
    assert reg.id == "upload_0"
    assert program.instructions[0]["path"] == "inputs/hello.txt"
    for path in ("inputs/hello.txt", "inputs/hello.txt/x", "inputs"):
        with pytest.raises(ValueError):
            program.upload_file(blob=b"x", path=path)
    with pytest.raises(TypeError):
        program.upload_file(blob="text", path="b")
    for bad in ("/abs", "a/../b", "a\\b", "", ".", 3, "x" * 256):
        with pytest.raises(ValidationError):
            program.upload_file(blob=b"x", path=bad)
    assert len(program.instructions) == 1


def test_get_function_accepts_registers_and_reference_dicts():
    program = Program()
    mod = module(program, id="m")
    program.get_function(module=mod, name="f", id="a")
    program.get_function(module={"$ref": "m"}, name="f", cpu_only=True, id="b")
    a, b = program.instructions[1:]
    assert a == {"op": "get_function", "id": "a", "module": {"$ref": "m"}, "name": "f"}
    assert b["cpu_only"] is True
    with pytest.raises(TypeError):
        program.get_function(module="m", name="f")
    with pytest.raises(TypeError):
        program.get_function(module={"$ref": 1}, name="f")
    with pytest.raises(ValueError):
        program.get_function(module=Register("other"), name="f")
    with pytest.raises(ValueError):
        program.get_function(module=mod, name="")
    with pytest.raises(TypeError):
        program.get_function(module=mod, name="f", cpu_only=1)


def test_run_arguments_follow_the_reference_and_literal_rules():
    program = Program()
    mod = module(program, id="m")
    fn = program.get_function(module=mod, name="f", id="fn")
    literal = {"nested": [{"$ref": "m"}], "t": (1, 2)}
    args = [mod, {"$ref": "fn"}, {"$ref": 5}, {"$ref": "m", "x": 1}, literal, None, True, 1.5]
    program.run(fn=fn, args=args, id="out")
    literal["nested"].append("later")
    sent = program.instructions[-1]["args"]
    assert sent == [
        {"$ref": "m"},
        {"$ref": "fn"},
        {"$ref": 5},
        {"$ref": "m", "x": 1},
        {"nested": [{"$ref": "m"}], "t": [1, 2]},
        None,
        True,
        1.5,
    ]
    program.run(fn=fn, args=(), id="empty")
    assert "args" not in program.instructions[-1]


@pytest.mark.parametrize(
    ("args", "error"),
    [
        ("abc", TypeError),
        ([{"$ref": "missing"}], ValueError),
        ([Register("missing")], ValueError),
        ([[Register("m")]], TypeError),
        ([{"k": Register("m")}], TypeError),
        ([math.nan], ValueError),
        ([[math.inf]], ValueError),
        ([{1: "x"}], TypeError),
        ([object()], TypeError),
        ([b"bytes"], TypeError),
        ([{1, 2}], TypeError),
    ],
)
def test_bad_run_arguments_are_refused(args, error):
    program = Program()
    mod = module(program, id="m")
    fn = program.get_function(module=mod, name="f")
    with pytest.raises(error):
        program.run(fn=fn, args=args)
    assert len(program.instructions) == 2


def _module(program):
    return program.upload(kind="module", source="def f(x):\n    return x\n")


# Each builder call that takes a str, given one with a lone surrogate ('\udcff', as a
# surrogateescape decoding makes), and the words that name it.
LONE_SURROGATES = {
    "module source": (
        lambda p: p.upload(kind="module", source="def f():\n    return '\udcff'\n"),
        "module source holds a lone surrogate at position 21 ('\\udcff')",
    ),
    "run argument": (
        lambda p: p.run(fn=p.get_function(module=_module(p), name="f"), args=["ok\udcff"]),
        "a str argument holds a lone surrogate at position 2",
    ),
    "nested argument": (
        lambda p: p.run(fn=p.get_function(module=_module(p), name="f"), args=[["a", "\udcff"]]),
        "a str argument holds a lone surrogate at position 0",
    ),
    "object key": (
        lambda p: p.run(fn=p.get_function(module=_module(p), name="f"), args=[{"k\udcff": 1}]),
        "an object key holds a lone surrogate at position 1",
    ),
    "return key": (
        lambda p: p.return_(key="y\udcff", value=_module(p)),
        "return key holds a lone surrogate at position 1",
    ),
    "function name": (
        lambda p: p.get_function(module=_module(p), name="f\udcff"),
        "get_function name holds a lone surrogate at position 1",
    ),
    "id": (
        lambda p: p.upload(id="m\udcff", kind="bytes", value=b""),
        "id holds a lone surrogate at position 1",
    ),
}


@pytest.mark.parametrize(("build", "words"), LONE_SURROGATES.values(), ids=LONE_SURROGATES)
def test_a_lone_surrogate_is_refused_by_the_builder_call_naming_where(build, words):
    # each passed, and execute failed with 'cannot encode the request: 'utf-8' codec can't
    # encode character '\udcff' in position 96', a place in the whole request
    program = Program()
    with pytest.raises(ValueError) as refused:
        build(program)
    assert str(refused.value).startswith(words)
    assert str(refused.value).endswith("which UTF-8 cannot carry (bytes travel as a bytes upload)")


def test_cyclic_literals_are_refused_but_shared_ones_are_copied():
    program = Program()
    fn = program.get_function(module=module(program), name="f")
    cycle: list = []
    cycle.append(cycle)
    with pytest.raises(ValueError):
        program.run(fn=fn, args=[cycle])
    shared = [1]
    program.run(fn=fn, args=[[shared, shared]])
    assert program.instructions[-1]["args"] == [[[1], [1]]]


def test_run_needs_a_register_function():
    program = Program()
    module(program, id="m")
    with pytest.raises(TypeError):
        program.run(fn={"$ref": "m"})


def test_returns_validate_keys_values_and_paths():
    program = Program()
    mod = module(program, id="m")
    path_reg = program.upload_file(blob=b"x", path="a.txt", id="p")
    program.return_(key="m", value=mod)
    program.return_(key="v", value={"$ref": "m"})
    program.return_file(key="f", path="./out//x.bin")
    program.return_file(key="g", path=path_reg)
    program.return_folder(key="d", path="out")
    assert program.instructions[2:] == [
        {"op": "return", "key": "m", "value": {"$ref": "m"}},
        {"op": "return", "key": "v", "value": {"$ref": "m"}},
        {"op": "return", "key": "f", "kind": "file", "path": "out/x.bin"},
        {"op": "return", "key": "g", "kind": "file", "path": {"$ref": "p"}},
        {"op": "return", "key": "d", "kind": "folder", "path": "out"},
    ]
    before = snapshot(program)
    for call in (
        lambda: program.return_(key="m", value=mod),
        lambda: program.return_(key="", value=mod),
        lambda: program.return_(key=1, value=mod),
        lambda: program.return_(key="x", value=Register("zz")),
        lambda: program.return_file(key="x", path=Register("zz")),
        lambda: program.return_file(key="x", path="../x"),
        lambda: program.return_folder(key="x", path=5),
        lambda: program.return_folder(key="x", path={"$ref": "p"}),
    ):
        with pytest.raises(ValueError):
            call()
    with pytest.raises(TypeError):
        program.return_(key="x", value="m")
    assert snapshot(program) == before


def test_instructions_is_a_copy_of_the_list():
    program = Program()
    module(program)
    program.instructions.clear()
    assert len(program.instructions) == 1


def test_registers_are_hashable_values():
    assert Register("a") == Register("a") and len({Register("a"), Register("a")}) == 1
    with pytest.raises(TypeError):
        Register(1)  # type: ignore[arg-type]
