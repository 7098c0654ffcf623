"""``multipart/form-data`` codec (PROTOCOL.md §3.1, §7.2), zero-copy in both directions.

Parsing searches the body with ``bytes.find`` (memchr speed) and returns parts as
``memoryview`` slices of the body: a 256 MiB upload is never copied and never walked byte by
byte in Python. Encoding returns a list of chunks that reference the caller's buffers.
"""

from __future__ import annotations

import mmap
import re
import secrets
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, overload

from kcoral.protocol.errors import ValidationError

# RFC 2046 §5.1.1: bcharsnospace, plus space (never last), 1-70 characters.
_BOUNDARY_RE = re.compile(r"[0-9A-Za-z'()+_,\-./:=? ]{0,69}[0-9A-Za-z'()+_,\-./:=?]")
# RFC 7230 token characters (header names, parameter names, media type parts).
_TOKEN_RE = re.compile(r"[!#$%&'*+\-.^_`|~0-9A-Za-z]+")
_MAX_HEADER_BLOCK = 64 * 1024  # part headers are a few short lines; this bounds the scan
# After "--boundary": "--" for the closing delimiter, transport padding, the line end.
_DELIMITER_TAIL = re.compile(rb"(--)?[ \t]*(\r\n|\n|\Z)")


@dataclass(frozen=True)
class Part:
    """One part: ``name`` from its disposition, bare lowercase media type, zero-copy data."""

    name: str
    content_type: str
    data: memoryview


# ------------------------------------------------------------------ header value syntax


def _split_parameters(value: str, what: str) -> tuple[str, list[tuple[str, str]]]:
    """Split ``type; a=b; c="d"`` into the leading value and (lowercase name, value) pairs."""
    head, sep, rest = value.partition(";")
    params: list[tuple[str, str]] = []
    i, n = 0, len(rest)
    while sep and i < n:
        while i < n and rest[i] in " \t;":
            i += 1
        if i >= n:
            break
        eq = rest.find("=", i)
        if eq < 0:
            raise ValidationError(f"{what}: parameter without '='")
        name = rest[i:eq].strip()
        if not _TOKEN_RE.fullmatch(name):
            raise ValidationError(f"{what}: invalid parameter name {name!r}")
        i = eq + 1
        while i < n and rest[i] in " \t":
            i += 1
        if i < n and rest[i] == '"':
            param_value, i = _quoted_string(rest, i + 1, what)
            while i < n and rest[i] in " \t":
                i += 1
            if i < n and rest[i] != ";":
                raise ValidationError(f"{what}: text after quoted parameter value")
        else:
            end = rest.find(";", i)
            end = n if end < 0 else end
            param_value = rest[i:end].strip()
            if not param_value or any(c in param_value for c in ' \t"'):
                raise ValidationError(f"{what}: invalid unquoted parameter value")
            i = end
        params.append((name.lower(), param_value))
    return head.strip(), params


def _quoted_string(text: str, start: int, what: str) -> tuple[str, int]:
    """The value of the quoted string whose opening quote is just before ``start``, and the
    index after its closing quote. Without a backslash before the first quote that quote
    closes it, and the value is one slice: a part's ``name="blob:<64 hex>"`` went through
    the character loop one append at a time, 30 % of parsing a body of 20,000 small parts."""
    close = text.find('"', start)
    if close >= 0 and "\\" not in text[start:close]:
        return text[start:close], close + 1
    chars: list[str] = []
    i, n = start, len(text)
    while True:
        if i >= n:
            raise ValidationError(f"{what}: unterminated quoted string")
        c = text[i]
        if c == "\\" and i + 1 < n:
            chars.append(text[i + 1])
            i += 2
        elif c == '"':
            return "".join(chars), i + 1
        else:
            chars.append(c)
            i += 1


def _media_type(value: str, what: str) -> str:
    """Lowercase ``type/subtype`` of a Content-Type value (parameters dropped)."""
    head, _ = _split_parameters(value, what)
    major, slash, minor = head.partition("/")
    if not slash or not _TOKEN_RE.fullmatch(major) or not _TOKEN_RE.fullmatch(minor):
        raise ValidationError(f"{what}: invalid media type {head!r}")
    return head.lower()


def boundary_from_content_type(value: str | None) -> bytes:
    """Boundary of a ``multipart/form-data`` Content-Type (§3.2 row 2), as ASCII bytes."""
    if value is None:
        raise ValidationError("missing Content-Type; expected multipart/form-data")
    what = "request Content-Type"
    head, params = _split_parameters(value, what)
    if head.lower() != "multipart/form-data":
        raise ValidationError(f"request Content-Type {head!r} is not multipart/form-data")
    boundaries = [v for name, v in params if name == "boundary"]
    if not boundaries:
        raise ValidationError("request Content-Type has no boundary parameter")
    if len(boundaries) > 1:
        raise ValidationError("request Content-Type has more than one boundary parameter")
    boundary = boundaries[0]
    if not _BOUNDARY_RE.fullmatch(boundary):
        raise ValidationError(f"invalid multipart boundary {boundary!r}")
    return boundary.encode("ascii")


# ---------------------------------------------------------------------------- searching


class _Finder:
    """``find`` over any contiguous byte buffer, reusing ``bytes.find`` when possible."""

    def __init__(self, buffer: memoryview) -> None:
        self._haystack: Any = None  # bytes, bytearray or mmap.mmap: each has ``find``
        self._offset = 0
        base = buffer.obj
        # mmap too: the server's request body is a mapped memfd (``mmap.find`` is a memmem,
        # where the ``re`` fallback would compile a pattern per request)
        if isinstance(base, (bytes, bytearray, mmap.mmap)):
            if buffer.nbytes == len(base):
                self._haystack = base
            else:
                # A slice of a bytes object: search the object itself, shifted by the
                # slice's start, rather than copying the slice or falling back to re.
                import numpy as np

                start = np.frombuffer(buffer, np.uint8).ctypes.data
                origin = np.frombuffer(base, np.uint8).ctypes.data
                self._haystack, self._offset = base, start - origin
        self._buffer = buffer
        self._end = buffer.nbytes

    def find(self, needle: bytes, start: int, end: int | None = None) -> int:
        end = self._end if end is None else end
        if self._haystack is not None:
            at = self._haystack.find(needle, start + self._offset, end + self._offset)
            return at - self._offset if at >= 0 else -1
        match = re.compile(re.escape(needle)).search(self._buffer, start, end)
        return match.start() if match else -1


def _as_bytes_view(data: bytes | bytearray | memoryview) -> memoryview:
    view = data if isinstance(data, memoryview) else memoryview(data)
    if not view.c_contiguous:
        raise ValueError("multipart data must be a C-contiguous buffer")
    if view.format != "B" or view.ndim != 1:
        view = view.cast("B")
    return view


# ------------------------------------------------------------------------------ parsing


def _delimiter_end(view: memoryview, after: int) -> tuple[int, bool] | None:
    """Where the line of a delimiter ends and whether it closes; None if not a delimiter.

    ``after`` is the index just past ``--boundary``. Allowed: optional ``--`` (close), then
    spaces or tabs, then CRLF, LF, or (close delimiter only) the end of the body.
    """
    match = _DELIMITER_TAIL.match(view, after)
    if match is None:
        return None
    closing = match.group(1) is not None
    if not match.group(2) and not closing:
        return None  # "--boundary" at the very end of the body, without "--"
    return match.end(), closing


def _next_delimiter(
    finder: _Finder, view: memoryview, boundary: bytes, start: int
) -> tuple[int, int, bool] | None:
    """Next delimiter at a line start at or after ``start``.

    Returns (content end, index after the delimiter line, closing). The line break before the
    delimiter belongs to the delimiter, so the content end excludes it.
    """
    dash = b"--" + boundary
    if start == 0 and view[: len(dash)] == dash:
        found = _delimiter_end(view, len(dash))
        if found is not None:
            return 0, found[0], found[1]
    needle = b"\n" + dash
    search = max(start - 1, 0)
    while True:
        at = finder.find(needle, search)
        if at < 0:
            return None
        found = _delimiter_end(view, at + len(needle))
        if found is not None:
            content_end = at - 1 if at > start and view[at - 1] == 0x0D else at
            return max(content_end, start), found[0], found[1]
        search = at + 1


def _parse_headers(view: memoryview, start: int, end: int, index: int) -> tuple[str, str, int]:
    """Parse the header block of part ``index``; returns (name, media type, data start)."""
    limit = min(end, start + _MAX_HEADER_BLOCK)
    block = bytes(view[start:limit])
    lines: list[bytes] = []
    pos = 0
    while True:
        nl = block.find(b"\n", pos)
        if nl < 0:
            if pos == len(block) and limit == end and lines:
                # RFC 2046 makes the empty line and content optional: the last header's
                # line break is followed directly by the delimiter's. An empty part.
                break
            raise ValidationError(f"multipart part {index}: headers are not terminated")
        line = block[pos:nl]
        if line.endswith(b"\r"):
            line = line[:-1]
        pos = nl + 1
        if not line:
            break
        lines.append(line)
    data_start = start + pos

    dispositions: list[str] = []
    types: list[str] = []
    encodings: list[str] = []
    for raw in lines:
        try:
            header = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise ValidationError(f"multipart part {index}: header is not UTF-8") from None
        if header[0] in " \t":
            raise ValidationError(f"multipart part {index}: folded header lines are not allowed")
        name, colon, value = header.partition(":")
        if not colon or not _TOKEN_RE.fullmatch(name):
            raise ValidationError(f"multipart part {index}: malformed header line {header!r}")
        if any(c in value for c in "\r\x00"):
            raise ValidationError(f"multipart part {index}: control character in header")
        key = name.lower()
        if key == "content-disposition":
            dispositions.append(value.strip())
        elif key == "content-type":
            types.append(value.strip())
        elif key == "content-transfer-encoding":
            encodings.append(value.strip())

    what = f"multipart part {index}"
    if len(dispositions) != 1:
        raise ValidationError(f"{what}: expected exactly one Content-Disposition header")
    if len(types) != 1:
        raise ValidationError(f"{what}: expected exactly one Content-Type header")
    if len(encodings) > 1:
        raise ValidationError(f"{what}: more than one Content-Transfer-Encoding header")
    if encodings and encodings[0].lower() not in ("binary", "8bit"):
        raise ValidationError(
            f"{what}: Content-Transfer-Encoding {encodings[0]!r} is not binary or 8bit"
        )
    disposition, params = _split_parameters(dispositions[0], f"{what} Content-Disposition")
    if disposition.lower() != "form-data":
        raise ValidationError(f"{what}: Content-Disposition {disposition!r} is not form-data")
    names = [value for key, value in params if key == "name"]
    if len(names) != 1:
        raise ValidationError(f"{what}: expected exactly one name parameter")
    media_type = _media_type(types[0], f"{what} Content-Type")
    if media_type.startswith("multipart/"):
        raise ValidationError(f"{what}: nested multipart is not allowed")
    return names[0], media_type, data_start


def parse_multipart(body: memoryview | bytes | bytearray, boundary: bytes) -> list[Part]:
    """Split a ``multipart/form-data`` body into parts (§3.1, §3.2 row 3).

    Each ``Part.data`` is a slice of ``body`` (no copy). Raises ``ValidationError``.
    """
    view = _as_bytes_view(body)
    finder = _Finder(view)
    first = _next_delimiter(finder, view, boundary, 0)
    if first is None:
        raise ValidationError("multipart body has no delimiter line")
    _, pos, closing = first
    parts: list[Part] = []
    while not closing:
        following = _next_delimiter(finder, view, boundary, pos)
        if following is None:
            raise ValidationError("multipart body has no closing delimiter")
        content_end, next_pos, closing = following
        name, media_type, data_start = _parse_headers(view, pos, content_end, len(parts))
        parts.append(Part(name, media_type, view[data_start:content_end]))
        pos = next_pos
    if not parts:
        raise ValidationError("multipart body has no parts")
    return parts


# ----------------------------------------------------------------------------- encoding


#: The most bytes a request body hands on at a time: a streamed file's read, a progress
#: line's step, a look for an early answer (CLIENT_API §2.1 steps 9, 10, 12). One size for
#: all three, cut once (``kcoral.connection.transport.body_pieces``).
PIECE_BYTES = 1 << 20


class StreamedData(Protocol):
    """A part's data read only while the body is sent: its ``size`` is known up front, its
    bytes come from ``chunks()``, at most ``PIECE_BYTES`` each (which raises when it cannot
    give exactly those bytes)."""

    @property
    def size(self) -> int: ...

    def chunks(self) -> Iterator[bytes]: ...


_IN_MEMORY = (bytes, bytearray, memoryview)
#: One piece of an encoded body: bytes, a byte view, or data read as it is sent.
BodyChunk = bytes | memoryview | StreamedData


def chunk_length(chunk: BodyChunk) -> int:
    """Bytes ``chunk`` adds to the body."""
    if isinstance(chunk, bytes):
        return len(chunk)
    return chunk.nbytes if isinstance(chunk, memoryview) else chunk.size


def _quote(value: str) -> str:
    if any(c in value for c in "\r\n\x00"):
        raise ValueError(f"line break or NUL in multipart header value {value!r}")
    return value.replace("\\", "\\\\").replace('"', '\\"')


@overload
def encode_multipart(
    parts: Sequence[tuple[str, str, bytes | bytearray | memoryview]],
) -> tuple[str, list[bytes | memoryview], int]: ...


@overload
def encode_multipart(
    parts: Sequence[tuple[str, str, bytes | bytearray | memoryview | StreamedData]],
) -> tuple[str, Sequence[BodyChunk], int]: ...


def encode_multipart(
    parts: Sequence[tuple[str, str, bytes | bytearray | memoryview | StreamedData]],
) -> tuple[str, Sequence[BodyChunk], int]:
    """Encode (name, content type, data) parts; returns (Content-Type, chunks, length).

    The boundary is ``kcoral-<32 random hex>``, redrawn until no part in memory contains
    it. Data chunks are the caller's objects (byte views of them), never copies. Streamed
    data is not read here, so not searched: its bytes were hashed before this boundary was
    drawn, so they hold it only by a 2**-128 chance per place, and then the part would end
    early, fail its hash and be refused (400), never run.
    """
    views: list[tuple[str, str, memoryview | StreamedData]] = [
        (name, ctype, _as_bytes_view(data) if isinstance(data, _IN_MEMORY) else data)
        for name, ctype, data in parts
    ]
    while True:
        boundary = f"kcoral-{secrets.token_hex(16)}"
        needle = boundary.encode("ascii")
        if not any(
            boundary in name
            or (isinstance(view, memoryview) and _Finder(view).find(needle, 0) >= 0)
            for name, _, view in views
        ):
            break
    chunks: list[BodyChunk] = []
    lead = b""
    for name, ctype, view in views:
        header = (
            f"--{boundary}\r\n"
            f'Content-Disposition: form-data; name="{_quote(name)}"\r\n'
            f"Content-Type: {_quote(ctype)}\r\n\r\n"
        ).encode()
        chunks.append(lead + header)
        if chunk_length(view):
            chunks.append(view)
        lead = b"\r\n"
    chunks.append(lead + f"--{boundary}--\r\n".encode("ascii"))
    length = sum(map(chunk_length, chunks))
    return f"multipart/form-data; boundary={boundary}", chunks, length
