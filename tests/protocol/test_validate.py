"""Schema rules of PROTOCOL.md §4–§5 (§3.2 row 11) enforced by ``parse_program``."""

from __future__ import annotations

import copy
from typing import Any

import pytest

import kcoral
from kcoral.protocol.errors import ValidationError
from kcoral.protocol.schema import GetFunction, LiteralArg, Options, Ref, Return, Run, Upload
from kcoral.protocol.validate import parse_program

H1 = "5891b5b522d5df086d0ff0b110fbd9d21bb4fc7163af34d08286a2e846f6be03"
H2 = "ad73b9acd6e4a74b2f5bb5386658ce3bb146cd040a1867646ab3b973fb6632b1"

MODULE = {"op": "upload", "id": "mod", "kind": "module", "source": "def f(x):\n    return x\n"}
FN = {"op": "get_function", "id": "f", "module": {"$ref": "mod"}, "name": "f"}


def program(*instructions: dict, **extra: Any) -> dict:
    return {"instructions": [copy.deepcopy(i) for i in instructions], **extra}


def rejects(obj: object, *fragments: str) -> str:
    with pytest.raises(ValidationError) as info:
        parse_program(obj)
    message = str(info.value)
    for fragment in fragments:
        assert fragment in message, message
    return message


EXAMPLE = {
    "instructions": [
        MODULE,
        {"op": "get_function", "id": "add_one", "module": {"$ref": "mod"}, "name": "add_one"},
        {
            "op": "get_function",
            "id": "file_size",
            "module": {"$ref": "mod"},
            "name": "file_size",
            "cpu_only": True,
        },
        {
            "op": "upload",
            "id": "hello_path",
            "kind": "file",
            "path": "./inputs//hello.txt",
            "blob": H1,
        },
        {"op": "upload", "id": "x", "kind": "tensor", "dtype": "float32", "shape": [4], "blob": H2},
        {"op": "run", "id": "y", "fn": {"$ref": "add_one"}, "args": [{"$ref": "x"}]},
        {"op": "run", "id": "n", "fn": {"$ref": "file_size"}, "args": [{"$ref": "hello_path"}]},
        {"op": "run", "id": "answer", "fn": {"$ref": "add_one"}, "args": [41]},
        {"op": "return", "key": "answer", "value": {"$ref": "answer"}},
        {"op": "return", "key": "size", "value": {"$ref": "n"}},
        {"op": "return", "key": "y", "value": {"$ref": "y"}},
        {"op": "return", "key": "copy", "kind": "file", "path": "inputs/hello.txt"},
    ],
    "options": {"timeout_seconds": 30},
}


def test_the_specification_example_parses_into_typed_records() -> None:
    parsed = parse_program(copy.deepcopy(EXAMPLE))
    ins = parsed.instructions
    assert parsed.options == Options(timeout_seconds=30.0)
    assert ins[0] == Upload(0, "module", "mod", source=MODULE["source"], language="python")
    assert ins[2] == GetFunction(2, "file_size", Ref("mod"), "file_size", cpu_only=True)
    assert ins[3] == Upload(3, "file", "hello_path", blob=H1, path="inputs/hello.txt")
    assert ins[4] == Upload(4, "tensor", "x", blob=H2, dtype="float32", shape=(4,))
    assert ins[5] == Run(5, "y", Ref("add_one"), (Ref("x"),))
    assert ins[7] == Run(7, "answer", Ref("add_one"), (LiteralArg(41),))
    assert ins[8] == Return(8, "answer", "value", value=Ref("answer"))
    assert ins[11] == Return(11, "copy", "file", path="inputs/hello.txt")
    assert [i.op for i in ins[:4]] == ["upload", "get_function", "get_function", "upload"]
    assert parsed.blob_kinds() == {H1: frozenset({"file"}), H2: frozenset({"tensor"})}


def test_kcoral_parse_program_is_this_function() -> None:
    assert kcoral.parse_program is parse_program


# ------------------------------------------------------------------------- top level


@pytest.mark.parametrize(
    ("obj", "fragment"),
    [
        ([], "must be a JSON object"),
        ({}, "missing field 'instructions'"),
        ({"instructions": []}, "must not be empty"),
        ({"instructions": {}}, "must be an array"),
        (program(MODULE, extra=1), "unknown top-level field 'extra'"),
        (program(MODULE, options=[]), "'options' must be an object"),
        (program(MODULE, options={"timeout": 3}), "unknown option 'timeout'"),
    ],
)
def test_a_bad_top_level_is_rejected(obj: object, fragment: str) -> None:
    message = rejects(obj, fragment)
    assert not message.startswith("instruction")


@pytest.mark.parametrize(
    ("options", "expected"),
    [
        ({}, Options()),
        ({"timeout_seconds": 1}, Options(timeout_seconds=1.0)),
        ({"timeout_seconds": 0.25}, Options(timeout_seconds=0.25)),
        ({"timeout_seconds": 10**400}, Options(timeout_seconds=1.7976931348623157e308)),
        ({"output_limit_bytes": 0}, Options(output_limit_bytes=0)),
        ({"output_limit_bytes": 10**12}, Options(output_limit_bytes=10**12)),
        ({"gpu_count": 1}, Options(gpu_count=1)),
        ({"gpu_count": 8}, Options(gpu_count=8)),
    ],
)
def test_valid_options_are_kept_as_sent(options: dict, expected: Options) -> None:
    assert parse_program(program(MODULE, options=options)).options == expected


@pytest.mark.parametrize(
    "options",
    [
        {"timeout_seconds": 0},
        {"timeout_seconds": -1},
        {"timeout_seconds": True},
        {"timeout_seconds": "30"},
        {"timeout_seconds": None},
        {"timeout_seconds": float("inf")},
        {"timeout_seconds": float("nan")},
        {"output_limit_bytes": -1},
        {"output_limit_bytes": 1.0},
        {"output_limit_bytes": False},
        {"gpu_count": 0},
        {"gpu_count": 9},
        {"gpu_count": 2.0},
        {"gpu_count": True},
        {"gpu_count": None},
    ],
)
def test_a_bad_option_value_is_rejected(options: dict) -> None:
    rejects(program(MODULE, options=options), "option")


# ----------------------------------------------------------------------- instructions


@pytest.mark.parametrize(
    ("instruction", "fragment"),
    [
        ([], "instruction must be an object"),
        ({"id": "a"}, "missing field 'op'"),
        ({"op": "delete", "id": "a"}, "unknown op 'delete'"),
        ({"op": 5}, "unknown op"),
        ({"op": "upload", "id": "a", "source": ""}, "missing field 'kind'"),
        ({"op": "upload", "id": "a", "kind": "script", "source": ""}, "unknown upload kind"),
        ({"op": "upload", "id": "a", "kind": ["module"]}, "unknown upload kind"),
    ],
)
def test_a_malformed_instruction_is_rejected_with_its_index(
    instruction: object, fragment: str
) -> None:
    rejects(program(MODULE, instruction), "instruction 1: ", fragment)


UPLOADS: dict[str, dict[str, Any]] = {
    "module": {"op": "upload", "kind": "module", "id": "u", "source": "x = 1"},
    "tensor": {
        "op": "upload",
        "kind": "tensor",
        "id": "u",
        "blob": H1,
        "dtype": "int8",
        "shape": [2, 3],
    },
    "bytes": {"op": "upload", "kind": "bytes", "id": "u", "blob": H1},
    "file": {"op": "upload", "kind": "file", "id": "u", "blob": H1, "path": "a.txt"},
    "library": {"op": "upload", "kind": "library", "id": "u", "blob": H1},
}
REQUIRED = {
    "module": ["id", "source"],
    "tensor": ["id", "blob", "dtype", "shape"],
    "bytes": ["id", "blob"],
    "file": ["blob", "path"],
    "library": ["id", "blob"],
}
ALL_UPLOAD_FIELDS = {
    "id": "v",
    "source": "",
    "language": "python",
    "blob": H2,
    "dtype": "int8",
    "shape": [1],
    "path": "p",
}


@pytest.mark.parametrize("kind", list(UPLOADS))
def test_every_upload_kind_accepts_its_complete_field_set(kind: str) -> None:
    parsed = parse_program(program(UPLOADS[kind])).instructions[0]
    assert isinstance(parsed, Upload) and parsed.kind == kind and parsed.id == "u"


@pytest.mark.parametrize(("kind", "field"), [(k, f) for k in UPLOADS for f in REQUIRED[k]])
def test_an_upload_missing_a_required_field_is_rejected(kind: str, field: str) -> None:
    instruction = dict(UPLOADS[kind])
    del instruction[field]
    rejects(program(instruction), "instruction 0: ", f"missing field {field!r}")


FOREIGN_FIELDS = [
    (kind, name)
    for kind in UPLOADS
    for name in [*ALL_UPLOAD_FIELDS, "cpu_only"]
    if name not in UPLOADS[kind] and (kind, name) not in {("module", "language"), ("file", "id")}
]


@pytest.mark.parametrize(("kind", "field"), FOREIGN_FIELDS)
def test_an_upload_with_a_field_of_another_kind_is_rejected(kind: str, field: str) -> None:
    instruction = {**UPLOADS[kind], field: ALL_UPLOAD_FIELDS.get(field, True)}
    rejects(program(instruction), "instruction 0: ", f"unknown field {field!r}")


def test_a_file_upload_without_id_creates_no_handle() -> None:
    upload = {"op": "upload", "kind": "file", "blob": H1, "path": "a"}
    parsed = parse_program(program(upload)).instructions[0]
    assert isinstance(parsed, Upload) and parsed.id is None
    fn = {"op": "run", "id": "r", "fn": {"$ref": "a"}}
    rejects(program(upload, fn), "instruction 1: ", "unknown or forward reference 'a'")


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"language": "cuda"}, None),
        ({"language": "c++"}, "'language'"),
        ({"language": None}, "'language'"),
        ({"source": 5}, "'source' must be a string"),
        ({"source": "\ud800"}, "not valid Unicode"),
        ({"id": ""}, "'id' must not be empty"),
        ({"id": 3}, "'id' must be a string"),
    ],
)
def test_module_upload_field_rules(change: dict, fragment: str | None) -> None:
    instruction = {**UPLOADS["module"], **change}
    if fragment is None:
        parsed = parse_program(program(instruction)).instructions[0]
        assert isinstance(parsed, Upload) and parsed.language == "cuda"
    else:
        rejects(program(instruction), "instruction 0: ", fragment)


def test_a_module_without_language_defaults_to_python() -> None:
    parsed = parse_program(program(UPLOADS["module"])).instructions[0]
    assert isinstance(parsed, Upload) and parsed.language == "python"


@pytest.mark.parametrize(
    "blob", [H1.upper(), H1[:-1], H1 + "0", H1[:-1] + "g", H1 + "\n", 5, None, ""]
)
@pytest.mark.parametrize("kind", ["tensor", "bytes", "file", "library"])
def test_a_blob_that_is_not_64_lowercase_hex_is_rejected(kind: str, blob: object) -> None:
    rejects(program({**UPLOADS[kind], "blob": blob}), "instruction 0: ", "'blob'")


DTYPES = [
    "bool", "uint8", "int8", "int16", "int32", "int64", "float16", "float32", "float64",
    "bfloat16", "float8_e4m3fn", "float8_e5m2",
]  # fmt: skip


@pytest.mark.parametrize("dtype", DTYPES)
def test_all_twelve_dtypes_are_accepted(dtype: str) -> None:
    parsed = parse_program(program({**UPLOADS["tensor"], "dtype": dtype})).instructions[0]
    assert isinstance(parsed, Upload) and parsed.dtype == dtype


@pytest.mark.parametrize("dtype", ["float4_e2m1", "complex64", "Float32", "torch.float32", 4, None])
def test_an_unknown_dtype_is_rejected(dtype: object) -> None:
    rejects(program({**UPLOADS["tensor"], "dtype": dtype}), "instruction 0: ", "dtype")


@pytest.mark.parametrize("shape", [[], [0], [0, 5], [1, 2, 3, 4, 5, 6, 7, 8, 9], [2**40]])
def test_a_valid_shape_becomes_a_tuple(shape: list[int]) -> None:
    parsed = parse_program(program({**UPLOADS["tensor"], "shape": shape})).instructions[0]
    assert isinstance(parsed, Upload) and parsed.shape == tuple(shape)


@pytest.mark.parametrize("shape", [[-1], [True], [1.0], ["2"], [None], [[2]], 4, "4", None, {}])
def test_a_bad_shape_is_rejected(shape: object) -> None:
    rejects(program({**UPLOADS["tensor"], "shape": shape}), "instruction 0: ", "'shape'")


@pytest.mark.parametrize(
    "path", ["", "/abs", "a/../b", "..", "a\\b", "a\x00b", ".", "./", "//", "a" * 256, 5, None]
)
def test_a_bad_file_upload_path_is_rejected(path: object) -> None:
    rejects(program({**UPLOADS["file"], "path": path}), "instruction 0: ", "path")


def test_a_file_upload_path_is_normalized() -> None:
    parsed = parse_program(program({**UPLOADS["file"], "path": "./a//b/./c"})).instructions[0]
    assert isinstance(parsed, Upload) and parsed.path == "a/b/c"


@pytest.mark.parametrize(
    ("first", "second"),
    [("a.txt", "./a.txt"), ("data", "data/x.bin"), ("data/x.bin", "data"), ("a/b/c", "a/b")],
)
def test_conflicting_file_upload_paths_are_rejected_at_the_later_upload(
    first: str, second: str
) -> None:
    one = {"op": "upload", "kind": "file", "blob": H1, "path": first}
    two = {"op": "upload", "kind": "file", "blob": H2, "path": second}
    rejects(program(one, MODULE, two), "instruction 2: ")


def test_sibling_file_paths_with_a_common_prefix_do_not_conflict() -> None:
    one = {"op": "upload", "kind": "file", "blob": H1, "path": "data/x"}
    two = {"op": "upload", "kind": "file", "blob": H1, "path": "data/xy"}
    three = {"op": "upload", "kind": "file", "blob": H1, "path": "data.bin"}
    assert len(parse_program(program(one, two, three)).instructions) == 3


# -------------------------------------------------------------------- ids and refs


def test_ids_are_unique_across_the_whole_program() -> None:
    again = {**UPLOADS["bytes"], "id": "mod"}
    rejects(program(MODULE, again), "instruction 1: ", "duplicate id 'mod'")
    run = {"op": "run", "id": "f", "fn": {"$ref": "f"}}
    rejects(program(MODULE, FN, run), "instruction 2: ", "duplicate id 'f'")


def test_an_id_has_no_syntax_restriction_beyond_being_non_empty() -> None:
    odd = {**UPLOADS["bytes"], "id": " $ref ✓ /.. "}
    run = {"op": "run", "id": "x", "fn": {"$ref": " $ref ✓ /.. "}}
    assert len(parse_program(program(odd, run)).instructions) == 2


@pytest.mark.parametrize(
    "module",
    [{"$ref": "nope"}, {"$ref": "later"}, {"$ref": "g"}],
)
def test_a_reference_to_an_unknown_later_or_own_id_is_rejected(module: dict) -> None:
    fn = {"op": "get_function", "id": "g", "module": module, "name": "f"}
    later = {**UPLOADS["bytes"], "id": "later"}
    rejects(program(MODULE, fn, later), "instruction 1: ", "unknown or forward reference")


@pytest.mark.parametrize(
    "ref",
    ["mod", {"$ref": ""}, {"$ref": 5}, {"$ref": "mod", "x": 1}, {}, [{"$ref": "mod"}], None],
)
@pytest.mark.parametrize("where", ["get_function.module", "run.fn", "return.value", "return.path"])
def test_a_field_that_requires_a_reference_rejects_anything_else(ref: object, where: str) -> None:
    if where == "return.path" and isinstance(ref, str):
        ref = "../literal"  # a string is a literal path there; make it a bad one
    instructions: list[dict] = [MODULE]
    if where == "get_function.module":
        instructions.append({**FN, "module": ref})
    elif where == "run.fn":
        instructions.append({"op": "run", "id": "r", "fn": ref})
    elif where == "return.value":
        instructions.append({"op": "return", "key": "k", "value": ref})
    else:
        instructions.append({"op": "return", "key": "k", "kind": "folder", "path": ref})
    rejects(program(*instructions), "instruction 1: ")


# ----------------------------------------------------------------- get_function / run


@pytest.mark.parametrize(
    ("change", "fragment"),
    [
        ({"name": ""}, "'name' must not be empty"),
        ({"name": 3}, "'name' must be a string"),
        ({"cpu_only": 1}, "'cpu_only' must be a boolean"),
        ({"cpu_only": None}, "'cpu_only' must be a boolean"),
        ({"args": []}, "unknown field 'args'"),
        ({"kind": "module"}, "unknown field 'kind'"),
    ],
)
def test_get_function_field_rules(change: dict, fragment: str) -> None:
    rejects(program(MODULE, {**FN, **change}), "instruction 1: ", fragment)


@pytest.mark.parametrize("field", ["id", "module", "name"])
def test_get_function_requires_its_fields(field: str) -> None:
    fn = dict(FN)
    del fn[field]
    rejects(program(MODULE, fn), "instruction 1: ", f"missing field {field!r}")


def test_get_function_cpu_only_defaults_to_false() -> None:
    parsed = parse_program(program(MODULE, FN)).instructions[1]
    assert isinstance(parsed, GetFunction) and parsed.cpu_only is False


def test_run_args_default_to_empty_and_must_be_an_array() -> None:
    run = {"op": "run", "id": "r", "fn": {"$ref": "f"}}
    parsed = parse_program(program(MODULE, FN, run)).instructions[2]
    assert isinstance(parsed, Run) and parsed.args == ()
    rejects(program(MODULE, FN, {**run, "args": {"a": 1}}), "instruction 2: ", "'args'")
    rejects(program(MODULE, FN, {**run, "args": None}), "instruction 2: ", "'args'")


@pytest.mark.parametrize("field", ["id", "fn"])
def test_run_requires_id_and_fn(field: str) -> None:
    run = {"op": "run", "id": "r", "fn": {"$ref": "f"}}
    del run[field]
    rejects(program(MODULE, FN, run), "instruction 2: ", f"missing field {field!r}")


def test_run_rejects_unknown_fields() -> None:
    run = {"op": "run", "id": "r", "fn": {"$ref": "f"}, "kwargs": {}}
    rejects(program(MODULE, FN, run), "instruction 2: ", "unknown field 'kwargs'")


def test_run_resolves_references_only_at_the_top_level_of_args() -> None:
    args = [
        {"$ref": "mod"},
        {"$ref": 5},
        {"$ref": ""},
        {"$ref": "mod", "extra": 1},
        [{"$ref": "nowhere"}],
        {"inner": {"$ref": "nowhere"}},
        None,
        "mod",
    ]
    run = {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": args}
    parsed = parse_program(program(MODULE, FN, run)).instructions[2]
    assert isinstance(parsed, Run)
    assert parsed.args[0] == Ref("mod")
    assert [a.value for a in parsed.args[1:] if isinstance(a, LiteralArg)] == args[1:]


def test_a_top_level_reference_shaped_arg_must_name_an_earlier_handle() -> None:
    run = {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": [1, {"$ref": "r"}]}
    rejects(program(MODULE, FN, run), "instruction 2: ", "unknown or forward reference 'r'")


def test_a_run_result_can_be_a_later_fn() -> None:
    make = {"op": "run", "id": "g", "fn": {"$ref": "f"}, "args": []}
    call = {"op": "run", "id": "h", "fn": {"$ref": "g"}}
    assert len(parse_program(program(MODULE, FN, make, call)).instructions) == 4


# ---------------------------------------------------------------------------- return


def test_value_and_path_returns_parse() -> None:
    parsed = parse_program(
        program(
            MODULE,
            {"op": "upload", "kind": "file", "id": "p", "blob": H1, "path": "d/x"},
            {"op": "return", "key": "v", "value": {"$ref": "mod"}},
            {"op": "return", "key": "f", "kind": "file", "path": {"$ref": "p"}},
            {"op": "return", "key": "d", "kind": "folder", "path": "./d/"},
        )
    ).instructions
    assert parsed[2] == Return(2, "v", "value", value=Ref("mod"))
    assert parsed[3] == Return(3, "f", "file", path=Ref("p"))
    assert parsed[4] == Return(4, "d", "folder", path="d")


@pytest.mark.parametrize(
    ("instruction", "fragment"),
    [
        ({"op": "return", "key": "k"}, "missing field 'value'"),
        ({"op": "return", "value": {"$ref": "mod"}}, "missing field 'key'"),
        ({"op": "return", "key": "", "value": {"$ref": "mod"}}, "'key' must not be empty"),
        ({"op": "return", "key": 1, "value": {"$ref": "mod"}}, "'key' must be a string"),
        ({"op": "return", "key": "k", "value": {"$ref": "mod"}, "id": "x"}, "unknown field 'id'"),
        ({"op": "return", "key": "k", "value": {"$ref": "m"}, "path": "a"}, "unknown field 'path'"),
        ({"op": "return", "key": "k", "kind": "value", "value": {"$ref": "mod"}}, "return kind"),
        ({"op": "return", "key": "k", "kind": "dir", "path": "a"}, "return kind"),
        ({"op": "return", "key": "k", "kind": "file"}, "missing field 'path'"),
        ({"op": "return", "key": "k", "kind": "file", "path": "a", "value": 1}, "field 'value'"),
        ({"op": "return", "key": "k", "kind": "file", "path": "../a"}, "invalid path"),
        ({"op": "return", "key": "k", "kind": "folder", "path": "/"}, "invalid path"),
        ({"op": "return", "key": "k", "kind": "folder", "path": 3}, "'path'"),
        ({"op": "return", "key": "k", "kind": "file", "path": {"$ref": "zz"}}, "forward reference"),
    ],
)  # fmt: skip
def test_return_field_rules(instruction: dict, fragment: str) -> None:
    rejects(program(MODULE, instruction), "instruction 1: ", fragment)


def test_return_keys_are_unique_across_all_return_variants() -> None:
    value = {"op": "return", "key": "k", "value": {"$ref": "mod"}}
    folder = {"op": "return", "key": "k", "kind": "folder", "path": "x"}
    rejects(program(MODULE, value, folder), "instruction 2: ", "duplicate return key 'k'")


def test_return_keys_are_a_namespace_separate_from_ids() -> None:
    value = {"op": "return", "key": "mod", "value": {"$ref": "mod"}}
    parse_program(program(MODULE, value))


def test_a_return_creates_no_handle() -> None:
    value = {"op": "return", "key": "k", "value": {"$ref": "mod"}}
    run = {"op": "run", "id": "r", "fn": {"$ref": "k"}}
    rejects(program(MODULE, value, run), "instruction 2: ", "unknown or forward reference 'k'")


def test_the_first_broken_instruction_is_reported() -> None:
    bad1 = {"op": "run", "id": "a", "fn": {"$ref": "x"}}
    bad2 = {"op": "nope"}
    rejects(program(MODULE, bad1, bad2), "instruction 1: ")
