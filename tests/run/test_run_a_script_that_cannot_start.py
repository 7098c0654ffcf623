"""`kcoral run shell` of a sent file that is there but cannot start (CLIENT_API §11): the
line says why, as a local shell would. A script whose #! interpreter the server lacks, or
whose #! line ends in a carriage return (Windows line ends), read `./s.sh: No such file or
directory` of the very file sent; one with no #! line (which a local shell runs with sh)
read `Exec format error` alone."""

from __future__ import annotations

import shutil
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
from run_as_a_user import ServerWithAToken, kcoral_run, server_with_a_token


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerWithAToken]:
    with server_with_a_token(tmp_path_factory.mktemp("cannot-start")) as started:
        yield started


def sent_and_run(server: ServerWithAToken, directory: Path, name: str, content: bytes) -> str:
    """Send ``content`` as an executable ``name`` and run it; the one line kcoral run said."""
    script = directory / name
    script.write_bytes(content)
    script.chmod(0o755)
    done = kcoral_run(server, "shell", "--send", name, "--", f"./{name}", cwd=directory)
    assert (done.returncode, done.stdout) == (1, ""), done.stderr
    return done.stderr


def test_a_script_whose_interpreter_the_server_lacks_names_it(
    server: ServerWithAToken, tmp_path: Path
) -> None:
    said = sent_and_run(server, tmp_path, "s.sh", b"#!/bin/no-such-shell -e\necho hi\n")
    assert said == (
        "kcoral run: ./s.sh: its interpreter '/bin/no-such-shell' (its #! line) is not on "
        "the server\n"
    )


def test_a_script_whose_interpreter_is_there_but_cannot_start_does_not_call_it_missing(
    server: ServerWithAToken, tmp_path: Path
) -> None:
    """The interpreter is a sent script whose own interpreter is missing: the kernel's
    ENOENT is the same, but "is not on the server" was untrue of a file that is."""
    inner = tmp_path / "inner"
    inner.write_bytes(b"#!/bin/no-such-shell\n")
    inner.chmod(0o755)
    script = tmp_path / "s.sh"
    script.write_bytes(b"#!./inner\necho hi\n")
    script.chmod(0o755)
    done = kcoral_run(
        server, "shell", "--send", "inner", "--send", "s.sh", "--", "./s.sh", cwd=tmp_path
    )
    assert (done.returncode, done.stdout) == (1, ""), done.stderr
    assert done.stderr == (
        "kcoral run: ./s.sh: its interpreter './inner' (its #! line) is on the server but "
        "cannot start: run it alone to see why\n"
    )


def test_a_script_with_windows_line_ends_says_so(server: ServerWithAToken, tmp_path: Path) -> None:
    said = sent_and_run(server, tmp_path, "s.sh", b"#!/bin/sh\r\necho hi\r\n")
    assert said == (
        "kcoral run: ./s.sh: its #! line ends in a carriage return (Windows line ends), so it "
        "names '/bin/sh\\r', which is not there: convert the file to Unix line ends\n"
    )


def test_a_script_without_a_shebang_line_says_to_add_one(
    server: ServerWithAToken, tmp_path: Path
) -> None:
    said = sent_and_run(server, tmp_path, "s.sh", b"echo hi\n")
    assert said == (
        "kcoral run: ./s.sh: Exec format error: it has no #! line, so it cannot run directly; "
        "add one (#!/bin/sh)\n"
    )


def a_program_linked_for_a_missing_loader() -> bytes:
    """``true``, its ELF interpreter (PT_INTERP) renamed to a path no system has."""
    found = shutil.which("true")
    program = bytearray(Path(found).read_bytes()) if found else bytearray()
    if program[:5] != b"\x7fELF\x02" or program[5] != 1:
        pytest.skip("needs a 64-bit little-endian ELF true to rename its loader")
    (header_offset,) = struct.unpack_from("<Q", program, 0x20)
    header_size, header_count = struct.unpack_from("<HH", program, 0x36)
    for index in range(header_count):
        entry = header_offset + index * header_size
        (kind,) = struct.unpack_from("<I", program, entry)
        if kind == 3:  # PT_INTERP: the loader's path, NUL-ended
            (offset,) = struct.unpack_from("<Q", program, entry + 8)
            (size,) = struct.unpack_from("<Q", program, entry + 32)
            missing = b"/no-such-loader".ljust(size - 1, b"x")
            program[offset : offset + size - 1] = missing
            return bytes(program)
    pytest.skip("this system's true is linked statically: it names no loader")


def test_a_program_whose_loader_the_server_lacks_says_so(
    server: ServerWithAToken, tmp_path: Path
) -> None:
    said = sent_and_run(server, tmp_path, "app", a_program_linked_for_a_missing_loader())
    assert said == (
        "kcoral run: ./app: No such file or directory: the loader it was linked for is not on "
        "the server\n"
    )
