"""A malicious server's output holding a lone surrogate (JSON can carry ``"\\ud800"``, which
no UTF-8 text is): ``kcoral run`` and ``f.remote()`` write it as its escape. Before, the write
raised ``UnicodeEncodeError``: ``kcoral run`` ended with a traceback, and ``f.remote()``
raised it instead of returning the function's value."""

from __future__ import annotations

import io

import pytest

from kcoral.errors import PrintedOutput
from kcoral.remote.report import show_output
from kcoral.run.outputs import start_on_a_new_line, write_output


def strict_stream() -> io.TextIOWrapper:
    return io.TextIOWrapper(io.BytesIO(), encoding="utf-8", errors="strict")


def test_kcoral_run_writes_a_lone_surrogate_as_its_escape_and_a_non_utf8_byte_as_itself() -> None:
    start_on_a_new_line()
    stream = strict_stream()
    write_output(stream, "a\ud800b\udfff c\udc9b\udcff\n")
    assert stream.buffer.getvalue() == b"a\\ud800b\\udfff c\x9b\xff\n"  # type: ignore[attr-defined]


def test_a_remote_functions_lone_surrogate_print_is_written_as_its_escape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    stdout, stderr = strict_stream(), strict_stream()
    monkeypatch.setattr("sys.stdout", stdout)
    monkeypatch.setattr("sys.stderr", stderr)
    show_output(PrintedOutput("a\ud800b\n", "\udc9b\n"))
    stdout.flush()
    stderr.flush()
    assert stdout.buffer.getvalue() == b"a\\ud800b\n"  # type: ignore[attr-defined]
    assert stderr.buffer.getvalue() == b"\\udc9b\n"  # type: ignore[attr-defined]
