"""A ``--return-file`` text file shown whole is not labelled ``(preview)``. A file ending
in a newline, as nearly every text file does, was shown whole and still said
``(preview)``: the label compared the shown text, whose last newline the line split drops,
with the file's bytes. An in-process shell against a real CPU server."""

from __future__ import annotations

from typing import Any

import pytest
from IPython.utils.capture import capture_output

pytestmark = pytest.mark.timeout(300)


def file_display(ip: Any, content: str) -> str:
    """The HTML a cell that returns a text file of ``content`` shows for the file."""
    source = f"%%kcoral --return-file out.txt\nopen('out.txt', 'w').write({content!r})\n"
    with capture_output() as captured:
        result = ip.run_cell(source)
    assert result.error_in_exec is None, result.error_in_exec
    shown = [
        o.data["text/html"]
        for o in captured.outputs
        if "kcoral-file" in o.data.get("text/html", "")
    ]
    assert len(shown) == 1, [o.data for o in captured.outputs]
    return shown[0]


def test_a_short_text_file_ending_in_a_newline_is_shown_whole_without_preview(shell) -> None:
    html = file_display(shell, "hello file\n")
    assert "hello file" in html and "11 bytes" in html
    assert "(preview)" not in html, html


def test_windows_line_ends_are_no_missing_text(shell) -> None:
    assert "(preview)" not in file_display(shell, "a\r\nb\r\n")


def test_a_file_longer_than_the_preview_still_says_preview(shell) -> None:
    html = file_display(shell, "".join(f"line {i}\n" for i in range(100)))
    assert "line 0" in html and "line 99" not in html
    assert "(preview)" in html
