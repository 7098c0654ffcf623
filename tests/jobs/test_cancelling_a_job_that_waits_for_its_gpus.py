"""Cancelling a job whose worker waits for its GPUs (EXTENSIONS §5) ends it, however long
its end takes: the server answers ``DELETE /v1/jobs/{id}`` once the job's process tree is
gone, and its worker is killed under its GPUs' lease (SERVER §5), which another's program
may hold for minutes. ``cancel()`` was bounded as a status read (30 s for the whole
answer), so it raised ``TransportError`` 'cannot reach URL: no answer within 30.0 s' of a
server that was there and cancelled the job. Real server, fake GPUs, real workers."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from holding_program import holding
from job_helpers import wait_until_it_waits_for_the_gpu
from waiting import wait_for_file

import kcoral
import kcoral.jobs

ONE_FAKE_GPU = ["--device", "fake-gpu", "--fake-gpu-count", "1", "--workers-per-gpu", "2"]
#: the status reads' deadline in this test: well under the time the cancel waits here
SHORT_STATUS_DEADLINE_SECONDS = 0.5


@pytest.mark.parametrize("kcoral_server", [ONE_FAKE_GPU], indirect=True)
def test_cancelling_a_job_waiting_for_its_gpus_waits_for_its_end_and_says_cancelled(
    kcoral_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(kcoral.jobs, "STATUS_ANSWER_SECONDS", SHORT_STATUS_DEADLINE_SECONDS)
    held, go = tmp_path / "held", tmp_path / "go"
    with kcoral.Client(kcoral_server.url) as client:
        holder = client.submit(holding(held, go))
        wait_for_file(held, 60.0)
        waiting = client.submit(holding(tmp_path / "never", go))
        wait_until_it_waits_for_the_gpu(waiting, "the second job's")

        outcome: dict[str, Any] = {}

        def cancel() -> None:
            try:
                outcome["state"] = waiting.cancel()
            except Exception as error:  # said below, with what it was
                outcome["error"] = error

        cancelling = threading.Thread(target=cancel)
        cancelling.start()
        # the kill waits for the holder's lease: let the (shortened) status deadline pass
        cancelling.join(SHORT_STATUS_DEADLINE_SECONDS * 4)
        go.touch()
        cancelling.join(60)
        assert not cancelling.is_alive(), "the cancel never came back"
        assert "error" not in outcome, f"cancel() raised {outcome.get('error')!r}"
        assert outcome["state"]["status"] == "CANCELLED"
        assert waiting.status()["status"] == "CANCELLED"
        assert holder.result(timeout=60).results["r"] == 1
