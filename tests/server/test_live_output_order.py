"""A job followed live keeps the order its program wrote stdout and stderr within ONE call
(EXTENSIONS §16): the worker writes each switch of stream into its progress slot, which the
front-end reads at each poll. Before, a poll sent stdout's new output before stderr's, so
``out``, ``err``, ``out again`` written within one poll showed as ``out``, ``out again``,
``err`` for good. A real server and real worker processes; the program waits for the test
to see each turn live (``live_output_order``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from kcoral_server.processes.progress_slot import ProgressSlot
from live_output_order import follow, in_order_written, live_program
from server_process import RunningServer, running_server

from kcoral import Client
from kcoral.protocol.output_order import MAX_RUNS

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(tmp_path_factory.mktemp("live-output-order") / "server") as running:
        yield running


@pytest.fixture(scope="module")
def client(server: RunningServer) -> Iterator[Client]:
    with Client(server.url) as made:
        yield made


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
