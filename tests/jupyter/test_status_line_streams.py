"""How a ``%%kcoral`` cell writes its program's output to the kernel's streams: a lone
surrogate a malicious server's JSON sends (``"\\ud800"``, which no UTF-8 text holds) is
written as its escape; it ended the cell in ``UnicodeEncodeError`` on a UTF-8 stream."""

from __future__ import annotations

import io

import pytest
from kcoral_jupyter.magics.status_line import StatusLine
from kcoral_jupyter.runner import RunRecord


def test_a_lone_surrogate_from_a_server_is_written_as_its_escape(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    raw = io.BytesIO()
    strict = io.TextIOWrapper(raw, encoding="utf-8", errors="strict")
    monkeypatch.setattr("sys.stdout", strict)
    line = StatusLine(False, RunRecord(server="http://127.0.0.1:9"))
    line.stdout("before \ud800 after\n")
    strict.flush()
    assert raw.getvalue() == b"before \\ud800 after\n"
