"""What of a remote tool's output reaches the user's terminal (CLIENT_API §11).

Who can reach what: the text ``kcoral run`` prints comes from a server the user named, which
may be malicious or run another user's code, and a terminal acts on escape strings in it:
OSC 52 writes the clipboard, OSC 0 retitles the window, a device status report or a window
query makes the terminal type its answer as if the user had, and a reset (``ESC c``) or
DCS string can hide what ran. On a terminal, ``kcoral run`` passes what colours and lays
out text (SGR, cursor motion, erasing, scrolling, modes: coloured test output and progress
bars; a private parameter such as ``?`` only in a DEC mode's ``h`` or ``l``, and of the
ANSI modes only insert and newline) and drops every
other escape sequence, every string sequence (OSC, DCS, SOS, PM, APC) and every C1 and C0
control but newline, carriage return, tab, backspace and bell.
Of the DEC modes only the cursor's, the line wrap's and the alternate screen's pass (mouse
and focus reports would be typed into the shell after the tool ends), and erasing the
scrollback (``CSI 3 J``) is dropped: what ran before stays readable. What the tool's
sequences left set (colours, a hidden cursor, the alternate screen, line drawing, no
wrapping, insert mode) is undone before ``kcoral run``'s own lines and at its end
(``restore``), so those lines and the shell's prompt show.
Written to a file or a pipe, the tool's bytes go through as they came. ``%%kcoral`` in a
terminal IPython filters a cell's output the same way (a notebook shows only colours).
"""

from __future__ import annotations

import re
import sys
from typing import TextIO

#: C0 controls a tool's text may carry to the terminal: line layout and the bell.
_KEPT_CONTROLS = frozenset("\n\r\t\b\x07")
#: CSI final bytes that colour, move the cursor, erase, scroll, insert or delete, set modes,
#: save or restore the cursor: none makes the terminal answer or change its window.
_KEPT_CSI_FINALS = frozenset("mABCDEFGHJKSTXdf@LMPhlrsu")
#: Private parameter bytes: with them the same finals are other functions, some of them
#: queries the terminal answers as typed input (``CSI ? u`` kitty's keyboard flags,
#: ``CSI ? Pp m`` xterm's key modifiers, ``CSI ? Pi;Pa;Pv S`` its graphics attributes), so
#: only the DEC modes (``h``, ``l``: cursor shown, alternate screen) keep them.
_PRIVATE_PARAMETERS = frozenset("<=>?")
#: The ANSI (not private) modes kept: insert (4) and newline (20). Others act on the user's
#: keyboard after the tool ends: ``CSI 2 h`` (KAM) locks it, ``CSI 12 l`` (SRM) turns on
#: local echo, so the password typed at the next prompt shows on the screen (xterm).
_KEPT_ANSI_MODES = frozenset({"4", "20"})
#: The DEC private modes kept (``CSI ? N h``/``l``): autowrap (7), cursor blink (12) and
#: visibility (25), the alternate screen (47, 1047, 1048, 1049). Mouse (9, 1000-1006) and
#: focus (1004) reports, bracketed paste (2004) and the like outlive the tool: the terminal
#: then types reports into the shell.
_KEPT_DEC_MODES = frozenset({"7", "12", "25", "47", "1047", "1048", "1049"})
#: ESC + one byte kept: save/restore cursor, reverse index, keypad modes.
_KEPT_ESCAPES = frozenset("78M=>")
#: ESC + this byte opens a string sequence (DCS, SOS, OSC, PM, APC): dropped to its end.
_STRING_OPENERS = frozenset("PX]^_")
#: 8-bit C1 forms of the string openers and of CSI; the string terminator ST is U+009C.
_C1_STRINGS = frozenset("\x90\x98\x9d\x9e\x9f")
_C1_CSI, _C1_ST = "\x9b", "\x9c"
#: Every character that is not plain text: C0 controls but the kept ones, DEL, C1, and
#: the C1 bytes of output that is not UTF-8 (kept as surrogates, written back as bytes).
_SPECIAL = re.compile("[\x00-\x06\x0b\x0c\x0e-\x1f\x7f-\x9f\udc80-\udc9f]")
#: The kept sequences, whole: what the byte-by-byte reading below would keep.
_KEPT_SEQUENCE = re.compile(
    "\x1b(?:\\[(?:[0-;]{0,62}[mABCDEFGHKSTXdf@LMPrsu]|\\?(?:7|12|25|47|104[789])"
    "(?:;(?:7|12|25|47|104[789]))*[hl]|(?:4|20)(?:;(?:4|20))*[hl])|[78M=>]|[()][B0])"
)
#: A CSI longer than this is no layout any tool sends: it is dropped, not held.
_MAX_CSI = 64


def is_terminal(stream: TextIO) -> bool:
    """Whether ``stream`` writes to a terminal (a replaced or closed stream does not)."""
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):
        return False


def utf8_writable(text: str) -> str:
    """``text`` with each lone surrogate as its escape (``\\ud800``): only a server's JSON
    can send one, and a UTF-8 stream's write of it raised ``UnicodeEncodeError``."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


_TEXT, _ESCAPE, _CSI, _CHARSET, _STRING, _STRING_ESCAPE, _LONG_CSI = range(7)


class TerminalFilter:
    """Feeds a stream's text through in chunks: a sequence cut between two chunks is held
    (at most ``_MAX_CSI`` characters) until the next one."""

    def __init__(self) -> None:
        self._state = _TEXT
        self._pending: list[str] = []
        #: what the kept sequences left set, and the sequence that undoes each
        self._left_set: dict[str, str] = {}

    def feed(self, text: str) -> str:
        kept: list[str] = []
        at, end = 0, len(text)
        while at < end:
            if self._state == _TEXT:
                # plain text goes through in runs: only a control is read byte by byte
                special = _SPECIAL.search(text, at)
                if special is None:
                    kept.append(text[at:])
                    break
                kept.append(text[at : special.start()])
                at = special.start()
                # a whole kept sequence in this chunk (most of a coloured output) at once
                sequence = _KEPT_SEQUENCE.match(text, at)
                if sequence is not None:
                    self._keep(sequence.group(), kept)
                    at = sequence.end()
                    continue
            self._step(text[at], kept)
            at += 1
        return "".join(kept)

    def _step(self, char: str, kept: list[str]) -> None:
        if "\udc80" <= char <= "\udc9f":
            char = chr(ord(char) - 0xDC00)  # a raw C1 byte: the terminal may read it as one
        state = self._state
        if state == _TEXT:
            self._text(char, kept)
        elif state == _ESCAPE:
            self._escape(char, kept)
        elif state == _CSI:
            self._csi(char, kept)
        elif state == _CHARSET:
            # ESC ( B / ESC ( 0: the ASCII and line-drawing sets; any other is dropped
            if char in "B0":
                self._keep("".join(self._pending) + char, kept)
            self._reset()
        elif state == _STRING:
            if char == "\x07" or char == _C1_ST:
                self._reset()
            elif char == "\x1b":
                self._state = _STRING_ESCAPE
        elif state == _STRING_ESCAPE:  # ESC \ ends the string; ESC and another byte starts anew
            self._reset()
            if char != "\\":
                self._escape(char, kept)
        else:  # _LONG_CSI: skipped to its final byte
            if "@" <= char <= "~":
                self._reset()
            elif not ("0" <= char <= "?" or " " <= char <= "/"):
                self._reset()
                self._text(char, kept)

    def _text(self, char: str, kept: list[str]) -> None:
        if char == "\x1b":
            self._state, self._pending = _ESCAPE, [char]
        elif char == _C1_CSI:
            self._state, self._pending = _CSI, ["\x1b["]
        elif char in _C1_STRINGS:
            self._state = _STRING
        elif _SPECIAL.match(char):
            pass  # other C0 and C1 controls (shift out garbles the character set)
        else:
            kept.append(char)

    def _escape(self, char: str, kept: list[str]) -> None:
        if char == "[":
            self._state, self._pending = _CSI, ["\x1b["]
        elif char in _STRING_OPENERS:
            self._state, self._pending = _STRING, []
        elif char in "()":
            self._state, self._pending = _CHARSET, ["\x1b", char]
        elif char == "\x1b":
            self._state, self._pending = _ESCAPE, [char]  # the first one led nowhere
        else:
            if char in _KEPT_ESCAPES:
                self._keep("\x1b" + char, kept)
            self._reset()

    def _csi(self, char: str, kept: list[str]) -> None:
        if "0" <= char <= "?" or " " <= char <= "/":  # parameters, intermediates
            self._pending.append(char)
            if len(self._pending) > _MAX_CSI:
                self._state, self._pending = _LONG_CSI, []
            return
        if "@" <= char <= "~":
            body = "".join(self._pending)
            has_intermediate = any(" " <= c <= "/" for c in body[2:])
            private = any(c in _PRIVATE_PARAMETERS for c in body[2:])
            if char in "hl":  # a DEC mode kept (its marker first), or an ANSI mode kept
                if body[2:3] == "?":
                    keep = _modes_kept(body[3:], _KEPT_DEC_MODES)
                else:
                    keep = not private and _modes_kept(body[2:], _KEPT_ANSI_MODES)
            elif char == "J":  # erase in display, but never the scrollback (3)
                keep = not private and "3" not in body[2:].split(";")
            else:
                keep = char in _KEPT_CSI_FINALS and not private
            if keep and not has_intermediate:
                self._keep(body + char, kept)
            self._reset()
            return
        # not a CSI byte: the sequence is broken; drop it and read this one as text
        self._reset()
        self._text(char, kept)

    def _reset(self) -> None:
        self._state, self._pending = _TEXT, []

    def _keep(self, sequence: str, kept: list[str]) -> None:
        """Pass ``sequence`` on, noting what it leaves set (``restore`` undoes it)."""
        kept.append(sequence)
        if sequence in ("\x1b(0", "\x1b(B"):
            self._note("charset", sequence == "\x1b(0", "\x1b(B")
        elif sequence.endswith("m"):
            self._note("colour", sequence[2:-1] not in ("", "0"), "\x1b[0m")
        elif sequence[-1] in "hl" and sequence.startswith("\x1b["):
            on, private = sequence[-1] == "h", sequence[2:3] == "?"
            for mode in sequence[2 + private : -1].split(";"):
                if private and mode == "25":
                    self._note("cursor", not on, "\x1b[?25h")
                elif private and mode == "7":
                    self._note("wrap", not on, "\x1b[?7h")
                elif private and mode in ("47", "1047", "1049"):
                    self._note("screen", on, f"\x1b[?{mode}l")
                elif not private and mode == "4":
                    self._note("insert", on, "\x1b[4l")

    def _note(self, what: str, left_set: bool, undo: str) -> None:
        if left_set:
            self._left_set[what] = undo
        else:
            self._left_set.pop(what, None)

    def restore(self) -> str:
        """The sequences that undo what the tool's output left set (the alternate screen
        first, whose own state the main screen does not share); afterwards nothing."""
        undo = sorted(self._left_set.items(), key=lambda item: item[0] != "screen")
        self._left_set.clear()
        return "".join(sequence for _what, sequence in undo)


def screened(text: str) -> str:
    """``text`` printed in one piece where a terminal may show it (an uncaught error's or a
    warning's line): screened as a tool's output is, and what its kept sequences left set
    (a colour) undone at its end. Python prints an error's ``str`` and a warning to a
    terminal byte for byte, so a server's text in one must pass here first."""
    screen = TerminalFilter()
    return screen.feed(text) + screen.restore()


def _modes_kept(parameters: str, kept: frozenset[str]) -> bool:
    """Whether every mode of an ``h``/``l`` is one of ``kept``."""
    return all(mode in kept for mode in parameters.split(";"))


class StandardStreams:
    """A ``TerminalFilter`` for each of stdout and stderr (an escape sequence may be cut
    between two chunks of one stream), and the undoing of what their text left set."""

    def __init__(self) -> None:
        self.forget()

    def forget(self) -> None:
        """Start anew: no sequence cut, nothing left set (another run in this process)."""
        self._filters = {"stdout": TerminalFilter(), "stderr": TerminalFilter()}

    def screen(self, name: str, stream: TextIO, text: str) -> str:
        """``text`` as ``stream`` (``sys.stdout`` or ``sys.stderr``, ``name``) gets it:
        through that stream's filter on a terminal, as it came elsewhere."""
        return self._filters[name].feed(text) if is_terminal(stream) else text

    def restore(self) -> None:
        """Undo on each terminal what the text screened for it left set (colours, a hidden
        cursor, the alternate screen: ``TerminalFilter.restore``)."""
        for name, stream in (("stdout", sys.stdout), ("stderr", sys.stderr)):
            undo = self._filters[name].restore()
            if undo and is_terminal(stream):
                stream.write(undo)
                stream.flush()
