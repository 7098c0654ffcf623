"""The multipart codec: framing rules of PROTOCOL.md §3.1 / §3.2 rows 2–3, zero copy."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kcoral.protocol.errors import ValidationError
from kcoral.protocol.multipart import (
    Part,
    boundary_from_content_type,
    encode_multipart,
    parse_multipart,
)

CD = b"Content-Disposition: form-data; "
JSON = b"Content-Type: application/json"
OCTETS = b"Content-Type: application/octet-stream"


def body(*lines: bytes, eol: bytes = b"\r\n") -> bytes:
    return eol.join(lines)


def simple(eol: bytes = b"\r\n") -> bytes:
    return body(
        b"--B",
        CD + b'name="program"',
        JSON,
        b"",
        b'{"a": 1}',
        b"--B",
        CD + b'name="blob:x"',
        OCTETS,
        b"",
        b"\x00\x01\r\n--Bnot\n",
        b"--B--",
        b"",
        eol=eol,
    )


def parse(data: bytes, boundary: bytes = b"B") -> list[Part]:
    return parse_multipart(memoryview(data), boundary)


# ----------------------------------------------------------------------- content type


@pytest.mark.parametrize(
    ("value", "boundary"),
    [
        ("multipart/form-data; boundary=abc", b"abc"),
        ("Multipart/Form-Data;boundary=abc", b"abc"),
        ("multipart/form-data; charset=utf-8; BOUNDARY=abc", b"abc"),
        ('multipart/form-data; boundary="a b:c"', b"a b:c"),
        ('multipart/form-data; boundary="ab\\"c"', None),
        ("multipart/form-data; boundary=" + "x" * 70, b"x" * 70),
        ("multipart/form-data; boundary=kcoral-0123;", b"kcoral-0123"),
        ("  multipart/form-data ; boundary=ab'()+_,-./:=?", b"ab'()+_,-./:=?"),
    ],
)
def test_a_valid_request_content_type_yields_its_boundary(value: str, boundary: bytes) -> None:
    if boundary is None:
        with pytest.raises(ValidationError):
            boundary_from_content_type(value)
    else:
        assert boundary_from_content_type(value) == boundary


@pytest.mark.parametrize(
    "value",
    [
        None,
        "",
        "application/json",
        "multipart/mixed; boundary=abc",
        "multipart/form-data",
        "multipart/form-data; charset=utf-8",
        "multipart/form-data; boundary=",
        'multipart/form-data; boundary=""',
        "multipart/form-data; boundary=" + "x" * 71,
        'multipart/form-data; boundary="abc "',
        "multipart/form-data; boundary=a b",
        "multipart/form-data; boundary=ab\u00e9",
        "multipart/form-data; boundary=a; boundary=b",
        'multipart/form-data; boundary="abc',
        "multipart/form-data; boundary",
    ],
)
def test_a_bad_request_content_type_is_rejected(value: str | None) -> None:
    with pytest.raises(ValidationError):
        boundary_from_content_type(value)


# ---------------------------------------------------------------------------- parsing


@pytest.mark.parametrize("eol", [b"\r\n", b"\n"])
def test_crlf_and_bare_lf_bodies_parse_alike(eol: bytes) -> None:
    parts = parse(simple(eol))
    assert [(p.name, p.content_type) for p in parts] == [
        ("program", "application/json"),
        ("blob:x", "application/octet-stream"),
    ]
    assert bytes(parts[0].data) == b'{"a": 1}'
    # "--B" not at a line start, and "--Bnot" at a line start, are both content.
    assert bytes(parts[1].data) == b"\x00\x01\r\n--Bnot\n"


def test_part_data_is_a_zero_copy_slice_of_the_body() -> None:
    data = bytearray(simple())
    parts = parse_multipart(memoryview(data), b"B")
    data[data.index(b"{")] = ord("[")
    assert bytes(parts[0].data).startswith(b"[")
    assert parts[0].data.obj is data


def test_a_body_slice_of_a_larger_buffer_is_parsed_in_place() -> None:
    raw = b"garbage" + simple() + b"trailing"
    view = memoryview(raw)[7 : 7 + len(simple())]
    parts = parse_multipart(view, b"B")
    assert bytes(parts[0].data) == b'{"a": 1}'
    assert parts[1].data.obj is raw


def test_plain_bytes_are_accepted_as_the_body() -> None:
    assert [p.name for p in parse_multipart(simple(), b"B")] == ["program", "blob:x"]


def test_preamble_and_epilogue_are_ignored() -> None:
    data = b"preamble --B\r\nstill preamble\r\n" + simple() + b"epilogue\r\n--B\r\nmore"
    assert len(parse(data)) == 2


def test_spaces_and_tabs_after_a_delimiter_are_allowed() -> None:
    data = body(b"--B \t", CD + b'name="program"', JSON, b"", b"{}", b"--B--\t ", b"", eol=b"\r\n")
    assert bytes(parse(data)[0].data) == b"{}"


def test_the_closing_delimiter_may_end_the_body() -> None:
    data = body(b"--B", CD + b'name="program"', JSON, b"", b"{}", b"--B--")
    assert bytes(parse(data)[0].data) == b"{}"


def test_the_delimiter_line_break_is_not_part_of_the_content() -> None:
    data = body(b"--B", CD + b'name="a"', OCTETS, b"", b"x\r\n", b"--B--")
    assert bytes(parse(data)[0].data) == b"x\r\n"


def test_an_empty_part_parses_with_or_without_the_blank_line() -> None:
    with_blank = body(b"--B", CD + b'name="a"', OCTETS, b"", b"", b"--B--")
    without = body(b"--B", CD + b'name="a"', OCTETS, b"", b"--B--")
    assert bytes(parse(with_blank)[0].data) == b""
    assert bytes(parse(without)[0].data) == b""


def test_the_filename_parameter_is_ignored_and_names_may_be_unquoted() -> None:
    data = body(
        b"--B",
        b'content-disposition: Form-Data; filename="x.bin"; name=program',
        b"CONTENT-TYPE: Application/JSON; charset=utf-8",
        b"Content-Transfer-Encoding: 8bit",
        b"X-Other: ignored",
        b"",
        b"{}",
        b"--B--",
    )
    [part] = parse(data)
    assert (part.name, part.content_type) == ("program", "application/json")


@pytest.mark.parametrize("encoding", [b"binary", b"8bit", b"BINARY"])
def test_binary_and_8bit_transfer_encodings_are_accepted(encoding: bytes) -> None:
    data = body(b"--B", CD + b'name="a"', OCTETS, b"Content-Transfer-Encoding: " + encoding)
    assert parse(data + b"\r\n\r\nx\r\n--B--")[0].name == "a"


def test_a_quoted_name_may_contain_escapes_and_semicolons() -> None:
    data = body(b"--B", CD + b'name="a\\"b;c"', OCTETS, b"", b"x", b"--B--")
    assert parse(data)[0].name == 'a"b;c'


@settings(max_examples=200, suppress_health_check=[HealthCheck.too_slow])
@given(st.text(alphabet=st.sampled_from('ab;= "\\'), max_size=12))
def test_any_quoted_name_parses_to_its_unescaped_value(name: str) -> None:
    # a name without a backslash is one slice up to the first quote, one with them is
    # unescaped character by character: both ways give the value that was quoted
    quoted = name.replace("\\", "\\\\").replace('"', '\\"').encode()
    data = body(b"--B", CD + b'name="' + quoted + b'"; filename="x\\y"', OCTETS, b"", b"--B--")
    assert parse(data)[0].name == name


def test_a_name_whose_only_quote_is_escaped_is_unterminated() -> None:
    with pytest.raises(ValidationError, match="unterminated"):
        parse(body(b"--B", CD + b'name="a\\"', OCTETS, b"", b"--B--"))


def test_more_than_a_hundred_parts_are_fine() -> None:
    chunks = [
        b"--B\r\n" + CD + b'name="p%d"\r\n' % i + OCTETS + b"\r\n\r\nx\r\n" for i in range(300)
    ]
    assert len(parse(b"".join(chunks) + b"--B--\r\n")) == 300


BAD_BODIES = {
    "no delimiter at all": b"just text\r\n",
    "no closing delimiter": body(b"--B", CD + b'name="a"', OCTETS, b"", b"x", b""),
    "closing delimiter not at line start": body(b"--B", CD + b'name="a"', OCTETS, b"", b"x--B--"),
    "zero parts": b"--B--\r\n",
    "headers not terminated": body(b"--B", CD + b'name="a"', OCTETS, b"--B--"),
    "no headers": body(b"--B", b"", b"x", b"--B--"),
    "two dispositions": body(b"--B", CD + b'name="a"', CD + b'name="a"', OCTETS, b"", b"--B--"),
    "no disposition": body(b"--B", OCTETS, b"", b"x", b"--B--"),
    "two content types": body(b"--B", CD + b'name="a"', OCTETS, OCTETS, b"", b"--B--"),
    "no content type": body(b"--B", CD + b'name="a"', b"", b"x", b"--B--"),
    "disposition not form-data": body(
        b"--B", b'Content-Disposition: attachment; name="a"', OCTETS, b"", b"--B--"
    ),
    "missing name": body(b"--B", CD + b'filename="a"', OCTETS, b"", b"--B--"),
    "repeated name": body(b"--B", CD + b'name="a"; name="b"', OCTETS, b"", b"--B--"),
    "nested multipart": body(
        b"--B", CD + b'name="a"', b"Content-Type: multipart/mixed; boundary=C", b"", b"--B--"
    ),
    "base64 transfer encoding": body(
        b"--B", CD + b'name="a"', OCTETS, b"Content-Transfer-Encoding: base64", b"", b"--B--"
    ),
    "two transfer encodings": body(
        b"--B",
        CD + b'name="a"',
        OCTETS,
        b"Content-Transfer-Encoding: binary",
        b"Content-Transfer-Encoding: binary",
        b"",
        b"--B--",
    ),
    "header without colon": body(b"--B", CD + b'name="a"', OCTETS, b"Broken", b"", b"--B--"),
    "folded header": body(b"--B", CD, b' name="a"', OCTETS, b"", b"--B--"),
    "header name with space": body(b"--B", CD + b'name="a"', b"Content Type: x/y", b"", b"--B--"),
    "media type without slash": body(
        b"--B", CD + b'name="a"', b"Content-Type: json", b"", b"--B--"
    ),
    "non-utf8 header": body(b"--B", CD + b'name="\xff"', OCTETS, b"", b"--B--"),
    "unterminated quoted name": body(b"--B", CD + b'name="a', OCTETS, b"", b"--B--"),
    "bad second part": body(b"--B", CD + b'name="a"', OCTETS, b"", b"x", b"--B", b"", b"--B--"),
}


@pytest.mark.parametrize("case", list(BAD_BODIES))
def test_a_malformed_body_is_rejected(case: str) -> None:
    with pytest.raises(ValidationError):
        parse(BAD_BODIES[case])


def test_huge_headers_without_a_blank_line_are_rejected() -> None:
    data = body(b"--B", CD + b'name="a"', OCTETS) + b"\r\nX: y" * 20000 + b"\r\n--B--\r\n"
    with pytest.raises(ValidationError, match="not terminated"):
        parse(data)


def test_a_large_body_with_few_parts_parses() -> None:
    payload = bytes(range(256)) * (32 * 1024 * 4)  # 32 MiB, never contains the delimiter
    content_type, chunks, length = encode_multipart(
        [("program", "application/json", b"{}"), ("blob:x", "application/octet-stream", payload)]
    )
    data = bytearray().join(chunks)
    assert len(data) == length
    parts = parse_multipart(memoryview(data), boundary_from_content_type(content_type))
    assert parts[1].data.nbytes == len(payload) and parts[1].data == payload


# ---------------------------------------------------------------------------- encoding


def test_encoding_uses_a_kcoral_boundary_crlf_and_the_callers_buffers() -> None:
    payload = bytearray(b"abc")
    view = memoryview(b"0123456789")[2:5]
    content_type, chunks, length = encode_multipart(
        [("result", "application/json", b"{}"), ("return:0", "application/octet-stream", payload),
         ("return:1", "application/octet-stream", view)]
    )  # fmt: skip
    boundary = content_type.removeprefix("multipart/form-data; boundary=")
    assert boundary.startswith("kcoral-") and len(boundary) == 39
    assert any(isinstance(c, memoryview) and c.obj is payload for c in chunks)
    data = b"".join(chunks)
    assert length == len(data)
    assert data.startswith(f"--{boundary}\r\n".encode())
    assert b'Content-Disposition: form-data; name="return:0"\r\n' in data
    assert b"Content-Type: application/octet-stream\r\n\r\nabc\r\n" in data
    assert data.endswith(f"\r\n--{boundary}--\r\n".encode())
    parsed = parse_multipart(data, boundary.encode())
    assert [bytes(p.data) for p in parsed] == [b"{}", b"abc", b"234"]


def test_the_boundary_is_redrawn_while_a_part_contains_it(monkeypatch: pytest.MonkeyPatch) -> None:
    draws = iter(["0" * 32, "1" * 32])
    monkeypatch.setattr("kcoral.protocol.multipart.secrets.token_hex", lambda n: next(draws))
    content_type, _, _ = encode_multipart(
        [("a", "application/octet-stream", memoryview(b"x\r\n--kcoral-" + b"0" * 32))]
    )
    assert content_type.endswith("kcoral-" + "1" * 32)


def test_encoding_zero_length_parts_round_trips() -> None:
    content_type, chunks, _ = encode_multipart([("a", "application/octet-stream", b"")])
    parts = parse_multipart(b"".join(chunks), boundary_from_content_type(content_type))
    assert [(p.name, bytes(p.data)) for p in parts] == [("a", b"")]


def test_typed_buffers_are_encoded_as_their_bytes() -> None:
    import array

    numbers = array.array("i", [1, 2])
    _, chunks, length = encode_multipart([("a", "application/octet-stream", memoryview(numbers))])
    assert numbers.tobytes() in b"".join(chunks) and length == len(b"".join(chunks))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(
        st.tuples(
            st.text(
                st.characters(blacklist_categories=("Cs",), blacklist_characters="\r\n\x00"),
                min_size=1,
                max_size=12,
            ),
            st.sampled_from(["application/json", "application/octet-stream", "text/plain"]),
            st.binary(max_size=64).map(lambda b: b.replace(b"\n", b"\r\n--kcoral-")),
        ),
        min_size=1,
        max_size=5,
    )
)
def test_anything_encoded_parses_back_unchanged(parts: list[tuple[str, str, bytes]]) -> None:
    content_type, chunks, length = encode_multipart(parts)
    data = b"".join(chunks)
    assert len(data) == length
    parsed = parse_multipart(memoryview(data), boundary_from_content_type(content_type))
    assert [(p.name, p.content_type, bytes(p.data)) for p in parsed] == parts
