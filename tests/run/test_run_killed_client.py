"""A ``kcoral run`` that is killed outright (SIGKILL: ``kill -9``, the OOM killer) cannot
cancel its job itself; it asks the server to cancel the job once nobody follows it
(``X-KCoral-Cancel-Unfollowed``, EXTENSIONS §5 and §7). Before, the job ran on to its
deadline, and nothing had printed its id to follow or cancel it by.

A real server as the README starts one: tokens on, the default sandbox.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from killed_kcoral_run import GRACE_SECONDS, kill_a_running_kcoral_run, wait_for_the_end
from server_process import RunningServer, client_token_file, running_server

from kcoral import Client, Program
from kcoral.errors import KCoralError
from kcoral.protocol.headers import CANCEL_UNFOLLOWED_HEADER

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

TOKEN = "token-run-killed-0123456789"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    directory = tmp_path_factory.mktemp("killed-client")
    tokens = client_token_file(directory, f"{TOKEN}\n")
    args = ["--log-dir", "", "--auth-token-file", str(tokens), "--sandbox", "auto"]
    with running_server(directory / "server", args) as running:
        yield running


def _only_job(client: Client) -> dict:
    jobs = [job for job in client.jobs() if job["status"] in ("QUEUED", "RUNNING")]
    assert len(jobs) == 1, jobs
    return jobs[0]


def test_a_kcoral_run_killed_with_sigkill_has_its_job_cancelled(
    server: RunningServer, tmp_path: Path
) -> None:
    kill_a_running_kcoral_run(server.url, TOKEN, tmp_path)
    with Client(server.url, token=TOKEN) as client:
        job_id = _only_job(client)["job_id"]
        state = wait_for_the_end(client, job_id, 120)
        assert state["status"] == "CANCELLED"
        with pytest.raises(KCoralError) as cancelled:
            client.job(job_id).result()
    assert cancelled.value.message == (
        f"the job was cancelled: no client followed its events for {GRACE_SECONDS} s "
        f"({CANCEL_UNFOLLOWED_HEADER})"
    )


def _sleeper(seconds: float) -> Program:
    program = Program()
    module = program.upload(
        kind="module", source=f"import time\ndef f():\n    time.sleep({seconds})\n", id="m"
    )
    program.return_(key="v", value=program.run(fn=program.get_function(module=module, name="f")))
    return program


def test_a_job_followed_all_along_is_not_cancelled(server: RunningServer) -> None:
    # The grace (1 s) passes three times while the job runs; its one follower stays.
    headers = {CANCEL_UNFOLLOWED_HEADER: "1"}
    with Client(server.url, token=TOKEN, headers=headers) as client:
        job = client.submit(_sleeper(3))
        for _event in job.events():
            pass
        assert job.status()["status"] == "COMPLETED"


def test_a_job_submitted_without_the_header_runs_on_unfollowed(server: RunningServer) -> None:
    with Client(server.url, token=TOKEN) as client:
        job = client.submit(_sleeper(2))
        job.result()  # never followed, and it completed
        assert job.status()["status"] == "COMPLETED"


@pytest.mark.parametrize("value", ["0", "-1", "1.5", "soon", "86401", "9" * 40])
def test_a_malformed_cancel_unfollowed_header_is_refused(server: RunningServer, value: str) -> None:
    with Client(server.url, token=TOKEN, headers={CANCEL_UNFOLLOWED_HEADER: value}) as client:
        with pytest.raises(KCoralError) as refused:
            client.submit(_sleeper(0))
    assert refused.value.status_code == 400
    assert refused.value.kind == "parse"
    assert refused.value.message == (
        f"{CANCEL_UNFOLLOWED_HEADER} must be a whole number of seconds from 1 to 86400"
    )


def test_another_identity_cannot_keep_an_unfollowed_job_alive(tmp_path: Path) -> None:
    # Its event stream is the same 404 as for an unknown id, so it counts as no follower:
    # the owner's abandoned job still ends.
    tokens = client_token_file(tmp_path, f"alice {TOKEN}\nbob token-bob-0123456789\n")
    args = ["--log-dir", "", "--auth-token-file", str(tokens)]
    with (
        running_server(tmp_path / "server", args) as running,
        Client(running.url, token=TOKEN, headers={CANCEL_UNFOLLOWED_HEADER: "2"}) as alice,
        Client(running.url, token="token-bob-0123456789") as bob,
    ):
        job = alice.submit(_sleeper(150))
        with pytest.raises(KCoralError) as refused:
            for _event in bob.job(job.id).events():
                pass
        assert refused.value.status_code == 404
        assert wait_for_the_end(alice, job.id, 120)["status"] == "CANCELLED"
