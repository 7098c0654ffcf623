"""The order of a program's stdout and stderr (EXTENSIONS §16): ``output_order``.

The worker captures the two streams into two files (SERVER §9), so an answer held
``print("a"); print("warn", file=sys.stderr); print("b")`` as ``a``, ``b`` and then
``warn``. A real server and real worker processes; the client is ``kcoral.Client`` (which
asks with ``X-KCoral-Output-Order: 1``) or raw HTTP, as a published client sends it.
"""

from __future__ import annotations

import io
import json
import os
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from kcoral_server.processes.progress_slot import ProgressSlot
from live_output_order import follow, in_order_written, live_program
from server_process import RunningServer, running_server

from kcoral import Client, Job, Program
from kcoral.connection.negotiation import execute_body
from kcoral.protocol.multipart import encode_multipart
from kcoral.protocol.output_order import MAX_RUNS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

SOURCE = r"""
import logging
import os
import sys
import warnings


def interleaved():
    print("a")
    print("warn", file=sys.stderr)
    print("b")
    warnings.warn("careful")
    logging.getLogger("order").error("logged")
    sys.stdout.write("c\n")
    return 1


def native_writes():
    print("py out 1")
    os.write(1, b"native out\n")
    print("py err", file=sys.stderr)
    os.write(2, b"native err\n")
    print("py out 2")
    return 1


def failing():
    print("before")
    raise ValueError("boom")


def forged():
    # the program's own record, spoiled: its answer must lose nothing over it
    sys.stdout.buffer._order.runs.append(5)
    print("out")
    print("err", file=sys.stderr)
    print("out again")
    return 1


def one_stream():
    print("only stdout")
    return 1


def crashing():
    print("out before the crash")
    print("err before the crash", file=sys.stderr)
    print("out again")
    os._exit(3)


def a_long_run_then_a_switch():
    sys.stdout.write("x" * (5 << 20))  # more than a poll reads of one stream at a time
    print("err", file=sys.stderr)
    print("out again")
    return 1


def spoiling_then_crashing():
    # the record in the progress slot, spoiled, then the worker dies: the answer reads it
    shared = sys.stdout.buffer._order.shared
    print("out")
    print("err", file=sys.stderr)
    print("out again")
    shared.run_written(1, 2, 1 << 60)
    shared.run_written(2, 1, -5)
    shared.run_written(3, 7, 0)
    shared._view[8:16] = (1 << 62).to_bytes(8, "little")
    os._exit(3)
"""


def program(name: str) -> Program:
    built = Program()
    module = built.upload(kind="module", source=SOURCE)
    fn = built.get_function(module=module, name=name)
    built.run(fn=fn)
    return built


def output_events(job: Job) -> list[tuple[str, str]]:
    """A job's stdout and stderr events until it finished, a piece per turn of stream."""
    pieces: list[tuple[str, str]] = []
    for event in job.events():
        if event.kind in ("stdout", "stderr"):
            if pieces and pieces[-1][0] == event.kind:
                pieces[-1] = (event.kind, pieces[-1][1] + event.text)
            else:
                pieces.append((event.kind, event.text))
        if event.kind == "phase" and event.finished:
            break
    return pieces


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("output-order") / "server") as running:
        yield running


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[Client]:
    with Client(server.url) as made:
        yield made


def test_prints_warnings_and_logging_come_back_in_the_order_the_program_wrote_them(
    client: Client,
) -> None:
    result = client.execute(program("interleaved"))
    assert result.completed
    pieces = result.output_in_order()
    assert [stream for stream, _ in pieces] == ["stdout", "stderr", "stdout", "stderr", "stdout"]
    assert pieces[0][1] == "a\n" and pieces[1][1] == "warn\n" and pieces[2][1] == "b\n"
    assert "careful" in pieces[3][1] and "logged" in pieces[3][1]
    assert pieces[4][1] == "c\n"
    # the two texts are what they always were
    assert result.stdout == "a\nb\nc\n" and "warn\n" in result.stderr


def test_native_writes_between_python_writes_keep_their_place(client: Client) -> None:
    result = client.execute(program("native_writes"))
    assert result.output_in_order() == [
        ("stdout", "py out 1\nnative out\n"),
        ("stderr", "py err\nnative err\n"),
        ("stdout", "py out 2\n"),
    ]


def test_a_traceback_follows_the_lines_printed_before_it(client: Client) -> None:
    result = client.execute(program("failing"))
    assert result.status == "FAILED"
    # the traceback is in the error object; what was printed comes back whole
    assert result.output_in_order()[0] == ("stdout", "before\n")


def test_a_program_that_spoils_its_own_record_loses_no_output(client: Client) -> None:
    result = client.execute(program("forged"))
    assert result.completed, result.error
    assert (result.stdout, result.stderr) == ("out\nout again\n", "err\n")
    assert result.output_order == ()


def test_a_program_writing_one_stream_gets_no_record(client: Client) -> None:
    result = client.execute(program("one_stream"))
    assert result.output_order == () and result.output_in_order() == [("stdout", "only stdout\n")]


def test_a_worker_that_dies_mid_program_still_returns_every_byte_it_wrote(
    client: Client,
) -> None:
    result = client.execute(program("crashing"))
    assert result.status == "FAILED"
    assert result.stdout == "out before the crash\nout again\n"
    assert result.stderr == "err before the crash\n"
    # the worker wrote each switch into its progress slot as it went: the order outlives it
    assert result.output_in_order() == [
        ("stdout", "out before the crash\n"),
        ("stderr", "err before the crash\n"),
        ("stdout", "out again\n"),
    ]


def test_a_program_that_spoils_its_record_and_dies_still_returns_every_byte(
    client: Client,
) -> None:
    result = client.execute(program("spoiling_then_crashing"))
    assert result.status == "FAILED"
    assert (result.stdout, result.stderr) == ("out\nout again\n", "err\n")
    assert "".join(text for _, text in result.output_in_order()) == "out\nerr\nout again\n"


def test_a_crash_keeps_the_order_up_to_the_last_switch_of_stream(client: Client) -> None:
    built = Program()
    module = built.upload(kind="module", source=SOURCE)
    built.run(fn=built.get_function(module=module, name="interleaved"))
    built.run(fn=built.get_function(module=module, name="crashing"))
    result = client.execute(built)
    assert result.status == "FAILED"
    names = [stream for stream, _ in result.output_in_order()]
    # the first call's five runs in order, then the crashed call's, up to its last switch
    assert names == ["stdout", "stderr", "stdout", "stderr", "stdout", "stderr", "stdout"]
    assert result.output_in_order()[4][1] == "c\nout before the crash\n"
    assert result.output_in_order()[5][1] == "err before the crash\n"
    assert result.output_in_order()[6][1] == "out again\n"


def _raw_execute(server: RunningServer, headers: dict[str, str]) -> dict:
    program_json = execute_body(program("interleaved"))
    content_type, chunks, _ = encode_multipart([("program", "application/json", program_json)])
    request = urllib.request.Request(
        f"{server.url}/execute",
        data=b"".join(chunks),
        headers={"Content-Type": content_type, **headers},
        method="POST",
    )
    with urllib.request.urlopen(request, timeout=60) as answer:
        return json.loads(answer.read())


def test_a_published_client_that_does_not_ask_gets_exactly_todays_fields(
    server: RunningServer,
) -> None:
    document = _raw_execute(server, {})
    assert "output_order" not in document
    assert document["stdout"] == "a\nb\nc\n" and document["stderr"].startswith("warn\n")


def test_a_client_that_asks_gets_runs_in_characters_of_the_texts(
    server: RunningServer,
) -> None:
    document = _raw_execute(server, {"X-KCoral-Output-Order": "1"})
    runs = document["output_order"]
    assert runs[:3] == [[1, 2], [2, 5], [1, 4]]
    assert runs[-1] == [1, len(document["stdout"])]


def test_the_server_lists_the_feature(client: Client) -> None:
    assert "output-order" in client.info()["features"]


def test_a_job_s_output_events_come_in_the_order_written(client: Client) -> None:
    job = client.submit(program("interleaved"))
    pieces = output_events(job)
    assert pieces == job.result().output_in_order()
    assert [stream for stream, _ in pieces] == ["stdout", "stderr", "stdout", "stderr", "stdout"]


def test_a_remote_function_replays_its_output_in_the_order_written(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    @client.function()
    def interleaved() -> int:
        import sys

        print("a")
        print("warn", file=sys.stderr)
        print("b")
        return 1

    screen = io.StringIO()  # one place for both streams, as a terminal shows them
    monkeypatch.setattr(sys, "stdout", screen)
    monkeypatch.setattr(sys, "stderr", screen)
    assert interleaved.remote() == 1
    assert screen.getvalue() == "a\nwarn\nb\n"


def test_a_job_s_run_longer_than_one_read_still_leaves_before_the_switch_after_it(
    client: Client,
) -> None:
    # a poll reads 4 MiB of a stream at most: the end of a job read one of its run, then
    # drained stdout whole before stderr, so 'out again' came before 'err'
    job = client.submit(program("a_long_run_then_a_switch"), output_limit_bytes=8 << 20)
    pieces = output_events(job)
    assert pieces == [("stdout", "x" * (5 << 20)), ("stderr", "err\n"), ("stdout", "out again\n")]


# A job followed live while ONE call writes both streams: the worker writes each switch of
# stream into its progress slot, which the front-end reads at each poll. Before, a poll sent
# stdout's new output before stderr's, so out, err, out again written within one poll showed
# as out, out again, err for good (``live_output_order``: each turn is seen live).


def test_a_job_followed_live_shows_one_calls_output_in_the_order_written(
    client: Client, tmp_path: Path
) -> None:
    job = client.submit(live_program(tmp_path))
    pieces = follow(job, tmp_path)
    result = job.result()
    assert result.completed, result.error
    assert "never saw" not in result.stdout  # each turn reached the test while it ran
    assert pieces == in_order_written()
    assert pieces == result.output_in_order()


def test_a_program_that_spoils_its_live_record_loses_no_output_and_stops_no_one(
    client: Client, tmp_path: Path
) -> None:
    # a run claiming 2**60 bytes, a count of 2**62 past runs filling the mapped pages, a
    # stream 7: the order is the program's own to spoil, the bytes and the server are not
    job = client.submit(live_program(tmp_path, spoiling=True))
    pieces = follow(job, tmp_path, last_stderr="spoiled")
    result = job.result()
    assert result.completed, result.error
    assert "never saw" not in result.stdout  # every turn still arrived live
    assert "".join(text for stream, text in pieces if stream == "stdout") == result.stdout
    assert "".join(text for stream, text in pieces if stream == "stderr") == result.stderr
    assert result.stderr == "".join(f"err {turn}\nspoiled {turn}\n" for turn in range(3))
    # the server goes on serving, in order
    follower = tmp_path / "after"
    follower.mkdir()
    job = client.submit(live_program(follower))
    assert follow(job, follower) == in_order_written()


def test_a_slot_reads_at_most_what_it_holds_and_what_was_asked() -> None:
    slot, fd = ProgressSlot.create()
    try:
        worker_side = ProgressSlot.attach(fd)
        for index in range(5):
            worker_side.run_written(index, 1 + index % 2, index)
        assert slot.runs_since(0, 100) == [(1, 0), (2, 1), (1, 2), (2, 3), (1, 4)]
        assert slot.runs_since(3, 1) == [(2, 3)]
        worker_side.run_written(MAX_RUNS, 1, 9)  # past the record: not written
        assert len(slot.runs_since(0, 2 * MAX_RUNS)) == 5
        worker_side.run_written(2, 7, 9)  # a stream that is neither ends what is read
        assert slot.runs_since(0, 100) == [(1, 0), (2, 1)]
        slot.reset()
        assert slot.runs_since(0, 100) == []
        worker_side.close()
    finally:
        slot.close()
        os.close(fd)
