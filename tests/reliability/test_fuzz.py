"""Hypothesis against a live server: malformed and valid-but-odd ``/execute`` requests.

Every answer must be a documented status with the exact body of PROTOCOL.md §7 (never the
``internal server error`` 500), and after each property the server is healthy and holds no
more descriptors, processes or workspaces than before. ``KCORAL_FUZZ_EXAMPLES=N`` runs N
examples per property instead of the CI defaults.
"""

from __future__ import annotations

import http.client
import json
import math
import uuid
from typing import Any

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from reliability_support import (
    BOUNDARY,
    REQUESTS_SENT,
    TRIVIAL,
    assert_no_leaks,
    blob_part,
    check_documented,
    check_error,
    check_healthy,
    exchange,
    execute,
    execute_body,
    framed,
    fuzz_examples,
    launch,
    multipart_type,
    part,
    post_execute,
    program_part,
    request_bytes,
    sha256,
    warm,
)

from kcoral import parse_program
from kcoral.protocol.errors import ValidationError
from kcoral.protocol.headers import is_canonical_uuid

pytestmark = pytest.mark.slow


def fuzz(default: int):
    return settings(
        max_examples=fuzz_examples(default),
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
    )


@pytest.fixture(scope="module")
def fuzz_server(tmp_path_factory):
    server = warm(
        launch(
            tmp_path_factory.mktemp("fuzz"),
            ["--num-workers", "2", "--max-request-bytes", str(4 << 20)],
        )
    )
    yield server
    server.stop()


#: Generated requests this module sent, printed at the end of the run (README "Bad inputs").
GENERATED = [0]


@pytest.fixture
def live(fuzz_server):
    """The module's server; after each property it is healthy and leaks nothing."""
    sent_before = REQUESTS_SENT[0]
    yield fuzz_server
    GENERATED[0] += REQUESTS_SENT[0] - sent_before
    check_healthy(fuzz_server.url)
    assert_no_leaks(fuzz_server.pid, fuzz_server.temp_dir, fuzz_server.baseline)


FILE_DATA = b"hello\n"
FILE_HASH = sha256(FILE_DATA)
FILE_PROGRAM = {
    "instructions": [
        {"op": "upload", "kind": "file", "path": "in/hello.txt", "blob": FILE_HASH},
        {"op": "return", "key": "copy", "kind": "file", "path": "in/hello.txt"},
    ]
}
DTYPES = {
    "bool": 1,
    "uint8": 1,
    "int8": 1,
    "int16": 2,
    "int32": 4,
    "int64": 8,
    "float16": 2,
    "float32": 4,
    "float64": 8,
    "bfloat16": 2,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
}

json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=8,
)
header_text = st.text(
    st.characters(min_codepoint=0x20, max_codepoint=0xFF, blacklist_characters="\x7f"), max_size=80
)


# ------------------------------------------------------------------ rows 2-9: the envelope


@fuzz(200)
@given(
    content_type=st.one_of(
        st.none(),
        st.sampled_from(
            [
                "text/plain",
                "application/json",
                "application/octet-stream",
                f"multipart/mixed; boundary={BOUNDARY}",
                "multipart/form-data",
                "multipart/form-data; boundary=",
                'multipart/form-data; boundary=""',
                "multipart/form-data; boundary=" + "x" * 71,
                "multipart/form-data; boundary=other",
                "multipart/form-data; boundary=bad boundary ",
                "multipart/form-data; charset=utf-8",
                f"multipart/form-data; boundary={BOUNDARY}; boundary={BOUNDARY}",
            ]
        ),
        header_text,
    )
)
def test_a_body_under_a_wrong_content_type_is_a_parse_error(live, content_type) -> None:
    assume(
        content_type is None
        or BOUNDARY not in content_type
        or "mixed" in content_type
        or content_type.count("boundary") > 1
    )
    answer = post_execute(live.url, execute_body(TRIVIAL), content_type)
    check_error(answer, 400, "parse")


def _framing_defects() -> dict[str, Any]:
    program = program_part(FILE_PROGRAM)
    blob = blob_part(FILE_DATA)
    other = b"other bytes"
    disposition = f'Content-Disposition: form-data; name="blob:{FILE_HASH}"'
    return {
        "no closing delimiter": framed([program, blob], close=False),
        "zero parts": f"--{BOUNDARY}--\r\n".encode(),
        "empty body": b"",
        "two dispositions": framed(
            [
                program,
                part(f"blob:{FILE_HASH}", "application/octet-stream", FILE_DATA, [disposition]),
            ]
        ),
        "no part content type": framed([program, part(f"blob:{FILE_HASH}", None, FILE_DATA)]),
        "two content types": framed(
            [
                part(
                    "program",
                    "application/json",
                    json.dumps(FILE_PROGRAM).encode(),
                    ["Content-Type: application/json"],
                ),
                blob,
            ]
        ),
        "no disposition": framed([program, part(None, "application/octet-stream", FILE_DATA)]),
        "disposition not form-data": framed(
            [
                program,
                b'Content-Disposition: attachment; name="x"\r\n'
                b"Content-Type: application/octet-stream\r\n\r\nx",
            ]
        ),
        "no name": framed(
            [
                program,
                b"Content-Disposition: form-data\r\n"
                b"Content-Type: application/octet-stream\r\n\r\nx",
            ]
        ),
        "repeated name": framed(
            [
                b'Content-Disposition: form-data; name="program"; name="program"\r\n'
                b"Content-Type: application/json\r\n\r\n{}"
            ]
        ),
        "nested multipart": framed(
            [program, part(f"blob:{FILE_HASH}", "multipart/mixed; boundary=inner", FILE_DATA)]
        ),
        "base64 transfer encoding": framed(
            [
                program,
                part(
                    f"blob:{FILE_HASH}",
                    "application/octet-stream",
                    FILE_DATA,
                    ["Content-Transfer-Encoding: base64"],
                ),
            ]
        ),
        "header without colon": framed([program, b"Content-Disposition form-data\r\n\r\nx"]),
        "unknown part name": framed([program, part("extra", "application/octet-stream", b"x")]),
        "uppercase blob name": framed(
            [program, part(f"blob:{FILE_HASH.upper()}", "application/octet-stream", FILE_DATA)]
        ),
        "short blob name": framed(
            [program, part("blob:abc", "application/octet-stream", FILE_DATA)]
        ),
        "no program": framed([blob]),
        "two programs": framed([program, program]),
        "program not json": framed(
            [part("program", "text/plain", json.dumps(FILE_PROGRAM).encode())]
        ),
        "blob not octet-stream": framed(
            [program, part(f"blob:{FILE_HASH}", "text/plain", FILE_DATA)]
        ),
        "duplicate blob": framed([program, blob, blob]),
        "hash mismatch": framed(
            [program, part(f"blob:{FILE_HASH}", "application/octet-stream", other)]
        ),
        "unreferenced blob": framed([program, blob, blob_part(other)]),
        "program not utf-8": framed(
            [part("program", "application/json", b'{"instructions": "\xff"}')]
        ),
        "program with NaN": framed(
            [
                part(
                    "program",
                    "application/json",
                    b'{"instructions": [], "options": {"timeout_seconds": NaN}}',
                )
            ]
        ),
        "program with duplicate key": framed(
            [part("program", "application/json", b'{"instructions": [], "instructions": []}')]
        ),
        "program top level array": framed([part("program", "application/json", b"[]")]),
        "program empty": framed([part("program", "application/json", b"")]),
    }


FRAMING_DEFECTS = _framing_defects()


@fuzz(200)
@given(
    defect=st.sampled_from(sorted(FRAMING_DEFECTS)),
    preamble=st.sampled_from([b"", b"preamble text\r\n"]),
    bare_lf=st.booleans(),
)
def test_every_framing_defect_of_row_3_to_10_is_a_parse_error(
    live, defect, preamble, bare_lf
) -> None:
    body = preamble + FRAMING_DEFECTS[defect]
    if bare_lf:
        body = body.replace(b"\r\n", b"\n")
    answer = post_execute(live.url, body, multipart_type())
    check_error(answer, 400, "parse")


@fuzz(300)
@given(data=st.data())
def test_a_body_cut_anywhere_before_its_closing_delimiter_is_a_parse_error(live, data) -> None:
    body = execute_body(FILE_PROGRAM, [FILE_DATA])
    cut = data.draw(st.integers(0, len(body) - len(b"--\r\n") - 1))
    answer = post_execute(live.url, body[:cut], multipart_type())
    check_error(answer, 400, "parse")


@fuzz(300)
@given(garbage=st.binary(max_size=2000), prefix=st.booleans())
def test_random_bytes_as_a_body_are_a_parse_error(live, garbage, prefix) -> None:
    body = (f"--{BOUNDARY}\r\n".encode() if prefix else b"") + garbage
    answer = post_execute(live.url, body, multipart_type())
    check_error(answer, 400, "parse")


@fuzz(60)
@given(
    sizes=st.lists(st.integers(1, 300), min_size=1, max_size=20),
    transport_padding=st.sampled_from([b"", b" \t"]),
    epilogue=st.sampled_from([b"", b"epilogue\r\n--" + BOUNDARY.encode() + b"\r\nnot a part"]),
)
def test_valid_bodies_in_odd_shapes_complete(live, sizes, transport_padding, epilogue) -> None:
    """Chunked transfer encoding, transport padding after delimiters, an epilogue."""
    body = execute_body(FILE_PROGRAM, [FILE_DATA])
    body = body.replace(
        f"--{BOUNDARY}\r\n".encode(), f"--{BOUNDARY}".encode() + transport_padding + b"\r\n"
    )
    body += epilogue
    chunks, offset, i = [], 0, 0
    while offset < len(body):
        size = sizes[i % len(sizes)]
        chunks.append(
            b"%x\r\n" % len(body[offset : offset + size]) + body[offset : offset + size] + b"\r\n"
        )
        offset += size
        i += 1
    raw = request_bytes(
        "POST",
        "/execute",
        b"".join(chunks) + b"0\r\n\r\n",
        [("Content-Type", multipart_type()), ("Transfer-Encoding", "chunked")],
        content_length=False,
    )
    answer = exchange(live.url, raw)
    check_documented(answer)
    assert answer.body["status"] == "COMPLETED", answer.body
    assert answer.parts["return:0"] == FILE_DATA


# ------------------------------------------------------------------ rows 10-11: the program


def _wrong(correct: type | tuple[type, ...]) -> st.SearchStrategy:
    def is_wrong(value: Any) -> bool:
        if isinstance(value, bool):
            return bool not in (correct if isinstance(correct, tuple) else (correct,))
        return not isinstance(value, correct)

    return json_values.filter(is_wrong)


bad_ids = _wrong(str) | st.just("")
bad_refs = json_values.filter(
    lambda v: not (isinstance(v, dict) and set(v) == {"$ref"})
) | st.sampled_from(
    [{"$ref": "nope"}, {"$ref": "later"}, {"$ref": ""}, {"$ref": 1}, {"$ref": "m", "x": 1}]
)
bad_hashes = _wrong(str) | st.text(max_size=70).filter(
    lambda s: not (len(s) == 64 and all(c in "0123456789abcdef" for c in s))
)
bad_shapes = _wrong(list) | st.lists(
    st.integers(max_value=-1) | st.booleans() | st.floats(allow_nan=False) | st.text(max_size=2),
    min_size=1,
    max_size=3,
)
bad_paths = _wrong(str) | st.sampled_from(
    [
        "",
        "/etc/passwd",
        "../x",
        "a/../b",
        "a\\b",
        "a\x00b",
        ".",
        "./",
        "//",
        "x" * 256,
        "/".join(["y" * 200] * 21),
    ]
)

# (instruction index or "options"/"top", field, strategy of invalid values)
MUTATIONS: list[tuple[Any, str, st.SearchStrategy]] = [
    (0, "op", json_values.filter(lambda v: v not in ("upload", "get_function", "run", "return"))),
    (
        0,
        "kind",
        json_values.filter(lambda v: v not in ("module", "tensor", "bytes", "file", "library")),
    ),
    (0, "id", bad_ids),
    (0, "source", _wrong(str)),
    (0, "language", json_values.filter(lambda v: v not in ("python", "cuda"))),
    (1, "module", bad_refs),
    (1, "name", bad_ids),
    (1, "cpu_only", _wrong(bool)),
    (1, "id", bad_ids | st.just("m")),
    (2, "fn", bad_refs),
    (2, "args", _wrong(list)),
    (2, "id", bad_ids),
    (3, "key", bad_ids),
    (3, "value", bad_refs),
    (4, "blob", bad_hashes),
    (4, "path", bad_paths),
    (5, "dtype", json_values.filter(lambda v: not (isinstance(v, str) and v in DTYPES))),
    (5, "shape", bad_shapes),
    (5, "blob", bad_hashes),
    (6, "blob", bad_hashes),
    (7, "kind", json_values.filter(lambda v: v not in ("file", "folder"))),
    (7, "path", bad_paths.filter(lambda v: not isinstance(v, dict))),
    (7, "key", st.just("value")),
    ("options", "timeout_seconds", _wrong((int, float)) | st.sampled_from([0, -1, -0.5, 0.0])),
    ("options", "output_limit_bytes", _wrong(int) | st.sampled_from([-1, 1.0, 2.5])),
    ("options", "gpu_count", json_values | st.integers(0, 9)),
    ("options", "unknown_option", json_values),
    ("top", "instructions", _wrong(list) | st.just([])),
    ("top", "extra", json_values),
]
FIELDS_OF = {
    0: {"op", "kind", "id", "source", "language"},
    1: {"op", "id", "module", "name", "cpu_only"},
    2: {"op", "id", "fn", "args"},
    3: {"op", "key", "value"},
    4: {"op", "kind", "path", "blob", "id"},
    5: {"op", "kind", "id", "dtype", "shape", "blob"},
    6: {"op", "kind", "id", "blob"},
    7: {"op", "key", "kind", "path"},
}


def _valid_program() -> dict:
    h = sha256(b"\x00" * 8)
    return {
        "instructions": [
            {
                "op": "upload",
                "kind": "module",
                "id": "m",
                "source": "def f(*a):\n    return 1\n",
                "language": "python",
            },
            {
                "op": "get_function",
                "id": "f",
                "module": {"$ref": "m"},
                "name": "f",
                "cpu_only": False,
            },
            {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": [1, {"$ref": "m"}]},
            {"op": "return", "key": "value", "value": {"$ref": "r"}},
            {"op": "upload", "kind": "file", "path": "a/b.bin", "blob": h, "id": "p"},
            {
                "op": "upload",
                "kind": "tensor",
                "id": "t",
                "dtype": "int64",
                "shape": [1],
                "blob": h,
            },
            {"op": "upload", "kind": "bytes", "id": "b", "blob": h},
            {"op": "return", "key": "file", "kind": "file", "path": "a/b.bin"},
        ],
        "options": {"timeout_seconds": 30, "output_limit_bytes": 100},
    }


def test_the_unmutated_program_is_valid_for_the_mutation_oracle() -> None:
    parse_program(_valid_program())


@fuzz(600)
@given(data=st.data())
def test_a_wrong_value_or_a_missing_or_unknown_field_anywhere_is_a_parse_error(live, data) -> None:
    program = _valid_program()
    how = data.draw(st.sampled_from(["wrong", "wrong", "wrong", "missing", "unknown"]))
    if how == "wrong":
        where, name, values = data.draw(st.sampled_from(MUTATIONS))
        value = data.draw(values)
        target = (
            program
            if where == "top"
            else program["options"]
            if where == "options"
            else program["instructions"][where]
        )
        target[name] = value
    elif how == "missing":
        index = data.draw(st.sampled_from(sorted(FIELDS_OF)))
        required = sorted(
            FIELDS_OF[index] - {"language", "cpu_only", "args"} - ({"id"} if index == 4 else set())
        )
        del program["instructions"][index][data.draw(st.sampled_from(required))]
    else:
        index = data.draw(st.sampled_from(sorted(FIELDS_OF)))
        name = data.draw(
            st.text(min_size=1, max_size=8).filter(lambda n: n not in FIELDS_OF[index])
        )
        program["instructions"][index][name] = data.draw(json_values)
    answer = execute(live.url, program, [b"\x00" * 8])
    check_error(answer, 400, "parse")


SOURCES = [
    "def f(*a):\n    return a\n",
    "x = 1\n",
    "def f(:\n",
    "import os\ndef g():\n    return os.getpid() > 0\n",
]
odd_instruction = st.fixed_dictionaries(
    {"op": st.sampled_from(["upload", "get_function", "run", "return", "other"])},
    optional={
        "id": st.sampled_from(["m", "f", "r", "", "über id", "m"]) | st.text(max_size=4),
        "kind": st.sampled_from(["module", "bytes", "file", "folder", "tensor"]),
        "source": st.sampled_from(SOURCES),
        "language": st.sampled_from(["python", "cuda"]),
        "module": st.sampled_from([{"$ref": "m"}, {"$ref": "f"}]),
        "name": st.sampled_from(["f", "g", "main", "x"]),
        "cpu_only": st.booleans(),
        "fn": st.sampled_from([{"$ref": "f"}, {"$ref": "m"}]),
        "args": st.lists(
            json_values | st.sampled_from([{"$ref": "m"}, {"$ref": 5}, {"$ref": "m", "k": 1}]),
            max_size=3,
        ),
        "key": st.text(max_size=3),
        "value": st.sampled_from([{"$ref": "r"}, {"$ref": "m"}, {"$ref": "f"}]),
        "path": st.sampled_from(["out", "./out//x", "."]),
        "blob": st.just(FILE_HASH),
    },
)


@fuzz(400)
@given(
    instructions=st.lists(odd_instruction, min_size=0, max_size=6),
    options=st.none()
    | st.fixed_dictionaries(
        {},
        optional={
            "timeout_seconds": st.sampled_from([5, 1e300, 2.5]),
            "output_limit_bytes": st.sampled_from([0, 10, 10**12]),
        },
    ),
    supply_blob=st.booleans(),
)
def test_arbitrary_programs_are_either_a_parse_error_or_run(
    live, instructions, options, supply_blob
) -> None:
    """The project's own validator is the oracle for 400 versus 200 here; the server must
    agree with it and never fail otherwise."""
    program: dict[str, Any] = {"instructions": instructions}
    if options is not None:
        program["options"] = options
    try:
        parsed = parse_program(program)
        expect_valid = True
        uses_blob = bool(parsed.blob_kinds())
    except ValidationError:
        expect_valid = uses_blob = False
    answer = execute(live.url, program, [FILE_DATA] if supply_blob else [])
    check_documented(answer)
    if not expect_valid or (supply_blob and not uses_blob):
        check_error(answer, 400, "parse")
    else:
        assert answer.status == 200, answer.body
        if uses_blob and not supply_blob:
            assert answer.body["status"] == "CACHE_MISS" or answer.body["status"] in (
                "COMPLETED",
                "FAILED",
            )
        else:
            assert answer.body["status"] in ("COMPLETED", "FAILED"), answer.body
        if answer.body["status"] == "FAILED":
            kinds = ("parse", "runtime", "serialization", "correctness", "unavailable")
            assert answer.body["error"]["kind"] in kinds, answer.body


@fuzz(40)
@given(
    depth=st.integers(1, 100_000),
    where=st.sampled_from(["args", "options", "top", "unbalanced"]),
)
def test_deeply_nested_json_is_a_documented_answer(live, depth, where) -> None:
    nested = "[" * depth + "]" * depth
    base = json.dumps(module_echo())
    if where == "args":
        text = base.replace('"args": []', f'"args": [{nested}]')
    elif where == "options":
        text = base[:-1] + f', "options": {{"timeout_seconds": {nested}}}}}'
    elif where == "top":
        text = nested
    else:
        text = base.replace('"args": []', '"args": [' + "[" * depth + "]")
    answer = post_execute(
        live.url, framed([part("program", "application/json", text.encode())]), multipart_type()
    )
    check_documented(answer)
    if where == "args":
        assert answer.status in (200, 400), answer.body
        if answer.status == 200:
            assert answer.body["status"] in ("COMPLETED", "FAILED"), answer.body
    else:
        check_error(answer, 400, "parse")


DEPTH_SOURCE = """
def depth(x):
    n = 0
    while isinstance(x, list) and x:
        x = x[0]
        n += 1
    return n
"""


def module_echo() -> dict:
    return {
        "instructions": [
            {
                "op": "upload",
                "id": "m",
                "kind": "module",
                "source": DEPTH_SOURCE,
            },
            {"op": "get_function", "id": "f", "module": {"$ref": "m"}, "name": "depth"},
            {"op": "run", "id": "r", "fn": {"$ref": "f"}, "args": []},
        ]
    }


# ------------------------------------------------------------------ §5.5 paths


def expected_path(path: str) -> str | None:
    """PROTOCOL §5.5, written out independently of ``kcoral.protocol.paths``."""
    if not path or path.startswith("/") or "\x00" in path or "\\" in path:
        return None
    parts = path.split("/")
    if ".." in parts:
        return None
    kept = [p for p in parts if p not in ("", ".")]
    if not kept or any(len(p.encode()) > 255 for p in kept):
        return None
    normalized = "/".join(kept)
    return normalized if len(normalized.encode()) <= 4096 else None


path_text = st.lists(
    st.sampled_from(
        [
            "",
            ".",
            "..",
            "a",
            "dir",
            "x" * 255,
            "y" * 256,
            "sp ace",
            "ü",
            "\\",
            "\x00",
            "~",
            "-rf",
            "$HOME",
            "*",
        ]
    )
    | st.text(st.characters(blacklist_categories=("Cs",)), max_size=8),
    min_size=1,
    max_size=6,
).map("/".join) | st.sampled_from(["/abs", "a" * 4097, "/".join(["d" * 255] * 17)])


@fuzz(300)
@given(path=path_text, as_return=st.booleans())
def test_workspace_paths_follow_section_5_5(live, path, as_return) -> None:
    normalized = expected_path(path)
    if as_return:
        program = {"instructions": [{"op": "return", "key": "k", "kind": "file", "path": path}]}
        answer = execute(live.url, program)
        if normalized is None:
            check_error(answer, 400, "parse")
        else:
            check_documented(answer)
            assert (
                answer.body["status"] == "FAILED"
                and answer.body["error"]["kind"] == "serialization"
            )
        return
    program = {
        "instructions": [
            {"op": "upload", "kind": "file", "id": "p", "path": path, "blob": FILE_HASH},
            {"op": "return", "key": "path", "value": {"$ref": "p"}},
            {"op": "return", "key": "copy", "kind": "file", "path": path},
        ]
    }
    answer = execute(live.url, program, [FILE_DATA])
    if normalized is None:
        check_error(answer, 400, "parse")
        return
    check_documented(answer)
    body = answer.body
    if body["status"] == "FAILED":
        # Legal by §5.5 yet refused by the file system (e.g. ENAMETOOLONG): a runtime failure.
        assert body["error"]["kind"] == "runtime" and body["error"]["instruction_index"] == 0, body
        return
    assert body["status"] == "COMPLETED", body
    assert body["results"]["path"] == {"type": "string", "value": normalized}
    assert answer.parts["return:0"] == FILE_DATA


@fuzz(60)
@given(
    first=st.sampled_from(["a", "a/b", "./a", "a//b/c"]),
    second=st.sampled_from(["a", "a/b", "a/b/c", "a/./b"]),
)
def test_conflicting_upload_paths_are_a_parse_error(live, first, second) -> None:
    one, two = expected_path(first), expected_path(second)
    conflict = one == two or two.startswith(one + "/") or one.startswith(two + "/")
    assume(conflict)
    program = {
        "instructions": [
            {"op": "upload", "kind": "file", "path": first, "blob": FILE_HASH},
            {"op": "upload", "kind": "file", "path": second, "blob": FILE_HASH},
        ]
    }
    check_error(execute(live.url, program, [FILE_DATA]), 400, "parse")


# ------------------------------------------------------------------ dtypes, shapes, row 14


@fuzz(60)
@given(
    dtype=st.sampled_from(sorted(DTYPES)) | st.text(max_size=12),
    shape=st.lists(st.integers(0, 6) | st.integers(0, 2**62), max_size=4),
    delta=st.sampled_from([0, 0, 0, -1, 1, 7]),
)
def test_tensor_dtypes_shapes_and_lengths_are_checked(live, dtype, shape, delta) -> None:
    expected = math.prod(shape) * DTYPES.get(dtype, 1)
    assume(expected + delta >= 0)
    length = expected + delta if expected + delta <= 4096 else 16
    modulus = 2 if dtype == "bool" else 251
    data = bytes(i % modulus for i in range(length))
    program = {
        "instructions": [
            {
                "op": "upload",
                "kind": "tensor",
                "id": "t",
                "dtype": dtype,
                "shape": shape,
                "blob": sha256(data),
            },
            {"op": "return", "key": "t", "value": {"$ref": "t"}},
        ]
    }
    answer = execute(live.url, program, [data])
    if dtype not in DTYPES or length != expected:
        check_error(answer, 400, "parse")
        return
    check_documented(answer)
    body = answer.body
    if body["status"] == "FAILED" and any(n > 2**31 for n in shape):
        # A zero-size tensor whose strides overflow torch's index type (§5.1).
        assert body["error"]["kind"] == "runtime", body
        assert body["error"]["message"].startswith("malformed tensor:"), body
        return
    assert body["status"] == "COMPLETED", body
    assert body["results"]["t"]["dtype"] == dtype and body["results"]["t"]["shape"] == shape
    assert answer.parts["return:0"] == data


# ------------------------------------------------------------------ headers


@fuzz(25)
@given(size=st.integers(1, 300_000), count=st.integers(1, 400))
def test_huge_or_many_headers_are_refused_without_harm(live, size, count) -> None:
    """Oversized header blocks are refused by the HTTP layer (Tornado closes the connection
    or answers a bare 4xx); anything that reaches /execute gets a documented answer."""
    value = "v" * (size // count + 1)
    headers = [("Content-Type", multipart_type())] + [(f"X-Fuzz-{i}", value) for i in range(count)]
    raw = request_bytes("POST", "/execute", execute_body(TRIVIAL), headers)
    try:
        answer = exchange(live.url, raw, timeout=30)
    except (OSError, http.client.HTTPException, json.JSONDecodeError):
        return  # refused below the application: the connection was closed
    if answer.body is not None:
        check_documented(answer)
    else:
        assert 400 <= answer.status < 500, answer.status


@fuzz(200)
@given(
    values=st.lists(
        st.uuids().map(str) | st.uuids().map(lambda u: str(u).upper()) | header_text, max_size=3
    )
)
def test_a_request_id_is_echoed_only_when_it_is_one_canonical_uuid(live, values) -> None:
    answer = execute(live.url, {"instructions": []}, headers=[("X-Request-ID", v) for v in values])
    check_error(answer, 400, "parse")
    echoed = answer.headers["x-request-id"]
    sent = [v.strip(" \t") for v in values]
    if len(sent) == 1 and is_canonical_uuid(sent[0]):
        assert echoed == sent[0]
    else:
        assert uuid.UUID(echoed).version == 4 and echoed not in sent
