"""A program cut by its deadline keeps what it printed (EXTENSIONS §15), through a real CPU
server and its worker. The 504's fixed body (PROTOCOL §7.4) had no output: a program that
printed its progress and then hung showed nothing of it, the one trace of how far it got.
The body now carries ``stdout``, ``stderr`` and their truncation flags beside the error;
the client's ``KCoralError`` has them as ``output``, ``.remote()`` prints them where the
caller's own prints go and then raises, and a job's result keeps them too."""

from __future__ import annotations

import json
import time
import urllib.request
from collections.abc import Iterator

import pytest
from raw_http import call_program, post_execute
from server_process import RunningServer, running_server

from kcoral import Client, Program
from kcoral.errors import KCoralError

SOURCE = """
import sys, time

def prints_then_hangs():
    print("step 1 done", flush=True)
    print("step 2 started", file=sys.stderr, flush=True)
    time.sleep(60)
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("deadline"), ["--num-workers", "1"]) as s:
        yield s


def hanging_program() -> Program:
    program = Program()
    module = program.upload(kind="module", source=SOURCE, id="m")
    fn = program.get_function(module=module, name="prints_then_hangs", id="f")
    program.run(fn=fn, id="out")
    return program


def test_a_program_past_its_deadline_answers_what_it_printed(server: RunningServer) -> None:
    with Client(server.url) as client:
        with pytest.raises(KCoralError) as caught:
            client.execute(hanging_program(), timeout_seconds=2)
    error = caught.value
    assert (error.status_code, error.kind) == (504, "timeout")
    assert error.message.startswith("execution timed out after its deadline of 2 s")
    assert error.output is not None
    assert (error.output.stdout, error.output.stderr) == ("step 1 done\n", "step 2 started\n")
    assert not (error.output.stdout_truncated or error.output.stderr_truncated)


RAW_SOURCE = SOURCE.replace("def prints_then_hangs", "def main")


def test_a_published_clients_504_is_exactly_the_three_fields_and_ours_carries_the_output(
    server: RunningServer,
) -> None:
    # PROTOCOL §7.4 fixes an ERROR body to exactly status, request_id and error: a client of
    # the published protocol, which does not send X-KCoral-Timeout-Output, gets just that
    program = call_program(RAW_SOURCE, timeout_seconds=2)
    published = post_execute(server.url, program)
    assert published.status == 504
    assert set(published.body) == {"status", "request_id", "error"}
    asked = post_execute(server.url, program, headers={"X-KCoral-Timeout-Output": "1"})
    assert asked.status == 504
    assert (asked.body["stdout"], asked.body["stderr"]) == ("step 1 done\n", "step 2 started\n")


INTERLEAVED_SOURCE = """
import sys, time

def main():
    print("out 1", flush=True)
    print("warn", file=sys.stderr, flush=True)
    print("out 2", flush=True)
    time.sleep(60)
"""


def test_a_504_keeps_the_order_of_stdout_and_stderr_for_a_client_that_asks(
    server: RunningServer,
) -> None:
    # EXTENSIONS §16 in a 504: out 1, warn, out 2 read as written, not stdout then stderr
    program = call_program(INTERLEAVED_SOURCE, timeout_seconds=2)
    asked = post_execute(
        server.url,
        program,
        headers={"X-KCoral-Timeout-Output": "1", "X-KCoral-Output-Order": "1"},
    )
    assert asked.status == 504
    # the last run is never closed by a switch: stdout's rest comes last by the rule
    assert asked.body["output_order"] == [[1, 6], [2, 5]]
    # a client that asked for the output but not for its order gets the fields of §15 only
    unordered = post_execute(server.url, program, headers={"X-KCoral-Timeout-Output": "1"})
    assert unordered.status == 504 and "output_order" not in unordered.body
    assert unordered.body["stdout"] == "out 1\nout 2\n"


def test_our_clients_timeout_error_gives_the_output_in_the_order_it_was_written(
    server: RunningServer,
) -> None:
    program = Program()
    module = program.upload(kind="module", source=INTERLEAVED_SOURCE, id="m")
    program.run(fn=program.get_function(module=module, name="main", id="f"), id="out")
    with Client(server.url) as client:
        with pytest.raises(KCoralError) as caught:
            client.execute(program, timeout_seconds=2)
    assert caught.value.output is not None
    assert caught.value.output.output_in_order() == [
        ("stdout", "out 1\n"),
        ("stderr", "warn\n"),
        ("stdout", "out 2\n"),
    ]


def test_a_timed_out_jobs_result_keeps_the_output_in_a_body_published_clients_read(
    server: RunningServer,
) -> None:
    with Client(server.url) as client:
        job = client.submit(hanging_program(), timeout_seconds=2)
        job.wait(timeout=60)
    with pytest.raises(urllib.error.HTTPError) as answered:
        urllib.request.urlopen(f"{server.url}{job.result_path}", timeout=30)
    assert answered.value.code == 504
    body = json.loads(answered.value.read())
    # the published fields as they were, the output beside them
    assert body["status"] == "ERROR" and body["error"]["kind"] == "timeout"
    assert set(body["error"]) == {"kind", "message"}
    assert (body["stdout"], body["stderr"]) == ("step 1 done\n", "step 2 started\n")
    assert (body["stdout_truncated"], body["stderr_truncated"]) == (False, False)


def test_a_cancelled_jobs_events_keep_what_it_printed(server: RunningServer) -> None:
    # A cancel (and a client gone, 499) has nobody to answer: the job's events keep it.
    with Client(server.url) as client:
        job = client.submit(hanging_program(), timeout_seconds=60)
        for _ in range(600):
            if any(e.kind == "stdout" for e in job.events()):
                break
            time.sleep(0.05)
        job.cancel()
        printed = "".join(e.text for e in job.events() if e.kind == "stdout")
    assert printed == "step 1 done\n"


def prints_then_hangs() -> None:
    import sys
    import time

    print("step 1 done", flush=True)
    print("step 2 started", file=sys.stderr, flush=True)
    time.sleep(60)


def test_a_remote_call_past_its_deadline_prints_what_it_printed_then_raises(
    server: RunningServer, capsys: pytest.CaptureFixture[str]
) -> None:
    with Client(server.url) as client:
        with pytest.raises(KCoralError) as caught:
            client.function(timeout=2)(prints_then_hangs).remote()
    seen = capsys.readouterr()
    assert (seen.out, seen.err) == ("step 1 done\n", "step 2 started\n")
    assert caught.value.status_code == 504
    assert "prints_then_hangs()'s timeout=2" in str(caught.value)
    assert caught.value.output is not None  # kept by the message naming the decorator


def test_output_past_the_servers_response_limit_is_left_out_of_the_504(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # --max-response-bytes bounds this answer as it bounds a finished program's
    directory = tmp_path_factory.mktemp("small-answers")
    with running_server(directory, ["--num-workers", "1", "--max-response-bytes", "300"]) as small:
        program = Program()
        source = "import time\ndef f():\n    print('x' * 1000, flush=True)\n    time.sleep(60)\n"
        module = program.upload(kind="module", source=source, id="m")
        program.run(fn=program.get_function(module=module, name="f", id="f"), id="out")
        with Client(small.url) as client:
            with pytest.raises(KCoralError) as caught:
                client.execute(program, timeout_seconds=2)
    assert (caught.value.status_code, caught.value.kind) == (504, "timeout")
    assert caught.value.output is None
