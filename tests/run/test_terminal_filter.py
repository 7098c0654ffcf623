"""What of a remote tool's output reaches the user's terminal (CLIENT_API §11): colours and
layout pass, every escape a malicious server could use on the terminal is dropped, and a
sequence cut between two chunks is read whole."""

from __future__ import annotations

import pytest

from kcoral.run.terminal_filter import TerminalFilter

COLOURED_TEST_RUN = "\x1b[32m.\x1b[0m\x1b[31mF\x1b[0m \x1b[1;31m1 failed\x1b[0m in 0.1s\n"
PROGRESS_BAR = "\r\x1b[K 40%|\x1b[34m####\x1b[0m      |\r\x1b[2K\x1b[1A\x1b[?25l\x1b[?25h\t\b\x07"


def filtered(text: str) -> str:
    return TerminalFilter().feed(text)


def test_colours_progress_bars_and_cursor_moves_pass_unchanged() -> None:
    assert filtered(COLOURED_TEST_RUN) == COLOURED_TEST_RUN
    assert filtered(PROGRESS_BAR) == PROGRESS_BAR
    assert filtered("\x1b7\x1b[10;1H\x1b8\x1b(0qqq\x1b(B\x1b[?1049h\x1b[?1049l") == (
        "\x1b7\x1b[10;1H\x1b8\x1b(0qqq\x1b(B\x1b[?1049h\x1b[?1049l"
    )


@pytest.mark.parametrize(
    ("attack", "what"),
    [
        ("\x1b]52;c;cm0gLXJmIH4K\x07", "OSC 52 writes the clipboard (BEL-terminated)"),
        ("\x1b]52;c;cm0gLXJmIH4K\x1b\\", "OSC 52 writes the clipboard (ST-terminated)"),
        ("\x1b]0;innocent title\x07", "OSC 0 retitles the window"),
        ("\x1b]8;;https://evil.example/\x1b\\link\x1b]8;;\x1b\\", "OSC 8 hides a link's target"),
        ("\x1bP$q m\x1b\\", "DCS asks the terminal to answer"),
        ("\x1b_hidden\x1b\\\x1b^hidden\x1b\\\x1bXhidden\x1b\\", "APC, PM, SOS strings"),
        ("\x1b[6n\x1b[c\x1b[>c\x1b[21t\x1b[18t", "status reports make the terminal type"),
        ("\x1b[8;100;100t\x1b[2 q\x1b[5$p", "window changes, cursor style, mode queries"),
        ("\x1bc", "a full reset clears the screen"),
        ("\x9b6n\x9d52;c;eA==\x9c\x90x\x9c\x85", "8-bit C1 controls"),
        ("\x0e\x0f\x00\x1a\x7f", "shift out/in, NUL, SUB, DEL"),
        ("\udc9b6n", "a C1 byte in output that is not UTF-8"),
    ],
)
def test_an_escape_a_server_could_use_on_the_terminal_is_dropped(attack: str, what: str) -> None:
    assert filtered(f"before {attack} after") in ("before  after", "before link after"), what


@pytest.mark.parametrize(
    "query",
    ["\x1b[?u", "\x1b[?4m", "\x1b[?1;1;0S", "\x1b[>1u", "\x1b[>4;2m", "\x1b[=1;1u"],
)
def test_a_private_csi_the_terminal_answers_or_keeps_is_dropped_in_one_chunk_or_many(
    query: str,
) -> None:
    # kitty's keyboard flags, xterm's key modifiers and graphics attributes: the finals of
    # kept layout, but with a private parameter the terminal types an answer or keeps a mode
    assert filtered(f"a{query}b") == "ab"
    stream = TerminalFilter()
    assert "".join(stream.feed(char) for char in f"a{query}b") == "ab"
    assert filtered("\x1b[?25l\x1b[?1049h") == "\x1b[?25l\x1b[?1049h"  # DEC modes pass


@pytest.mark.parametrize("mode", ["\x1b[2h", "\x1b[12l", "\x1b[4;12h", "\x1b[h"])
def test_an_ansi_mode_that_locks_the_keyboard_or_echoes_input_is_dropped(mode: str) -> None:
    # KAM (2) locks the keyboard, SRM (12) reset echoes what is typed (a password at the
    # next prompt); only insert (4) and newline (20) modes are layout
    assert filtered(f"a{mode}b") == "ab"
    stream = TerminalFilter()
    assert "".join(stream.feed(char) for char in f"a{mode}b") == "ab"
    assert filtered("\x1b[4h\x1b[4;20l") == "\x1b[4h\x1b[4;20l"


def test_text_after_an_unterminated_osc_string_is_dropped_until_its_end() -> None:
    stream = TerminalFilter()
    assert stream.feed("ok \x1b]52;c;") == "ok "
    assert stream.feed("still the string") == ""
    assert stream.feed("\x07visible") == "visible"


def test_a_sequence_cut_between_chunks_is_read_whole() -> None:
    text = f"{COLOURED_TEST_RUN}\x1b]0;title\x1b\\{PROGRESS_BAR}\x1b[6n end"
    expected = filtered(text)
    stream = TerminalFilter()
    assert "".join(stream.feed(char) for char in text) == expected
    assert "title" not in expected and "\x1b[6n" not in expected
    assert expected.startswith(COLOURED_TEST_RUN) and expected.endswith(" end")


def test_a_broken_or_overlong_csi_is_dropped_and_the_text_after_it_kept() -> None:
    assert filtered("a\x1b[12\nb") == "a\nb"
    assert filtered("a\x1b[" + "1;" * 500 + "mb") == "ab"
    assert filtered("a\x1b[" + "1;" * 500 + "\nb") == "a\nb"


def test_plain_text_and_unicode_pass_unchanged() -> None:
    text = "naïve café — 東京 ✓ \t tabs\r\nand lines\n" * 1000
    assert filtered(text) == text


@pytest.mark.parametrize(
    "mode",
    ["\x1b[?1000h", "\x1b[?1006h", "\x1b[?1004h", "\x1b[?2004h", "\x1b[?9h", "\x1b[?25;1000h"],
)
def test_modes_that_make_the_terminal_type_reports_after_the_tool_are_dropped(mode: str) -> None:
    # mouse, focus and paste reports would be typed into the shell once the tool has ended
    assert filtered(f"a{mode}b") == "ab"


def test_the_scrollback_is_never_erased_but_the_screen_may_be() -> None:
    assert filtered("a\x1b[3Jb\x1b[2;3Jc") == "abc"  # what ran before stays readable
    assert filtered("a\x1b[2Jb\x1b[Jc") == "a\x1b[2Jb\x1b[Jc"


def test_what_the_tool_left_set_is_undone_once_and_the_alternate_screen_first() -> None:
    stream = TerminalFilter()
    stream.feed("\x1b[31mred \x1b[?25l\x1b[?1049h\x1b(0qq\x1b[?7l\x1b[4h")
    assert stream.restore() == "\x1b[?1049l\x1b[0m\x1b[?25h\x1b(B\x1b[?7h\x1b[4l"
    assert stream.restore() == ""  # undone: nothing more


def test_a_tool_that_undoes_what_it_set_needs_nothing_undone() -> None:
    stream = TerminalFilter()
    stream.feed("\x1b[1;32mok\x1b[0m \x1b[?25l\r 40%\x1b[?25h\x1b[?1049h\x1b[?1049l\n")
    assert stream.restore() == ""
