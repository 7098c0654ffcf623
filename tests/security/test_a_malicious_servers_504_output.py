"""Attack: a malicious server's 504 carries what it claims the program printed before its
deadline (EXTENSIONS §15), to flood or crash the client, or to act on the user's terminal.

A stand-in server answers every ``/execute`` with a 504 ``timeout`` whose output fields are
huge, of the wrong type, or full of escape strings. The client keeps at most 16 Mi
characters of each stream, the most a server may capture (marked truncated), reads a field
of another type as no output (the error itself still reads), and ``kcoral run`` screens the
text for the terminal as it screens a tool's output, then says the deadline passed."""

from __future__ import annotations

import subprocess
import sys
from typing import Any, ClassVar

import pytest
from pseudo_terminal import on_a_terminal
from stand_in_http import StandIn, serving

from kcoral import Client, Program
from kcoral.errors import KCoralError
from kcoral.response import PRINTED_OUTPUT_CHARS

MESSAGE = "execution timed out after its deadline of 2 s (the program's timeout_seconds)"
HOSTILE = "before \x1b]52;c;cm0gLXJmIH4K\x07\x1b]0;owned\x1b\\ \x1b[6n\x1b[31mred\x1b[0m\n"


class TimesOut(StandIn):
    """Every ``/execute`` ends in a 504 with ``fields`` beside the error; nothing else is
    served (no ``/v1/info``: a published server's client path)."""

    fields: ClassVar[dict[str, Any]] = {}

    def do_GET(self) -> None:
        self.send_json({"status": "ERROR", "error": {"kind": "not_found", "message": "no"}}, 404)

    def do_POST(self) -> None:
        self.read_body()
        error = {"kind": "timeout", "message": MESSAGE}
        body = {"status": "ERROR", "request_id": "r-1", "error": error, **self.fields}
        self.send_json(body, 504)


def stand_in(fields: dict[str, Any]) -> type[TimesOut]:
    return type("Answering", (TimesOut,), {"fields": fields})


def timeout_error(fields: dict[str, Any]) -> KCoralError:
    program = Program()
    program.upload(kind="module", source="x = 1\n", id="m")
    with serving(stand_in(fields)) as url, Client(url) as client:
        with pytest.raises(KCoralError) as caught:
            client.execute(program, timeout_seconds=2)
    assert (caught.value.status_code, caught.value.kind, caught.value.message) == (
        504,
        "timeout",
        MESSAGE,
    )
    return caught.value


def test_a_flood_of_output_is_cut_to_what_a_server_may_capture() -> None:
    flood = PRINTED_OUTPUT_CHARS + 4096
    error = timeout_error({"stdout": "x" * flood, "stderr": "y" * flood})
    assert error.output is not None
    assert len(error.output.stdout) == len(error.output.stderr) == PRINTED_OUTPUT_CHARS
    assert error.output.stdout_truncated and error.output.stderr_truncated


@pytest.mark.parametrize(
    "fields",
    [
        {"stdout": 5, "stderr": ["x"], "stdout_truncated": "yes"},
        {"stdout": {"nested": [[[[1]]]]}, "stderr": None},
        {"stdout": "", "stderr": ""},
    ],
    ids=["numbers-and-lists", "objects-and-null", "empty"],
)
def test_output_fields_of_another_type_read_as_no_output(fields: dict[str, Any]) -> None:
    assert timeout_error(fields).output is None


def test_kcoral_run_screens_the_output_for_the_terminal_then_says_the_deadline_passed() -> None:
    with serving(stand_in({"stdout": HOSTILE, "stderr": "err \x1b]52;c;eA==\x07\n"})) as url:
        command = [sys.executable, "-m", "kcoral", "run", "python", "--url", url, "--timeout"]
        status, seen = on_a_terminal([*command, "2", "--", "-c", "print(1)"])
    text = seen.decode("utf-8", "replace")
    assert status == 1, text
    assert "]52" not in text and "owned" not in text and "\x1b[6n" not in text, repr(text)
    assert "\x1b[31mred\x1b[0m" in text and "err \r\n" in text, repr(text)
    # what it printed first, then why it ended
    assert text.index("before") < text.index("timed out after --timeout 2 s"), repr(text)


def test_kcoral_run_says_which_stream_was_cut_before_the_deadline_line() -> None:
    # what a genuine server sends for output past its limit, here from the stand-in
    with serving(stand_in({"stdout": "progress 40%\n", "stdout_truncated": True})) as url:
        command = [sys.executable, "-m", "kcoral", "run", "python", "--url", url, "--timeout"]
        done = subprocess.run(
            [*command, "2", "--", "-c", "print(1)"], capture_output=True, text=True, timeout=120
        )
    assert done.returncode == 1 and done.stdout == "progress 40%\n", done
    cut, timed_out = (
        done.stderr.index("the remote stdout was truncated at"),
        done.stderr.index("timed out after --timeout 2 s"),
    )
    assert cut < timed_out, done.stderr


@pytest.mark.parametrize(
    "order",
    [
        "stdout first",
        [[2, 3], [1, 10**30], [7, 1]],
        [[1, 2]] * 10_001,
        [[2, 10**18], [1, -5], [2, 1]],
    ],
    ids=["not-a-list", "a-stream-that-is-none", "too-many-runs", "ends-past-and-backwards"],
)
def test_a_bogus_output_order_in_a_504_loses_no_character(order: Any) -> None:
    # EXTENSIONS §16: the record is a hint; whatever it says, each character shows once
    error = timeout_error({"stdout": "out\n", "stderr": "err\n", "output_order": order})
    assert error.output is not None
    pieces = error.output.output_in_order()
    assert "".join(t for s, t in pieces if s == "stdout") == "out\n"
    assert "".join(t for s, t in pieces if s == "stderr") == "err\n"


def test_kcoral_run_writes_a_504s_output_in_the_order_the_server_recorded() -> None:
    # one pipe for both streams shows the order a terminal would (EXTENSIONS §16)
    fields = {"stdout": "out 1\nout 2\n", "stderr": "warn\n", "output_order": [[1, 6], [2, 5]]}
    with serving(stand_in(fields)) as url:
        command = [sys.executable, "-m", "kcoral", "run", "python", "--url", url, "--timeout"]
        done = subprocess.run(
            [*command, "2", "--", "-c", "print(1)"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            timeout=120,
        )
    assert done.returncode == 1
    assert done.stdout.startswith("out 1\nwarn\nout 2\n"), done.stdout
