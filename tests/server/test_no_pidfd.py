"""A server on a kernel without ``pidfd_open`` (Linux < 5.3, gVisor): forced on any kernel
with ``KCORAL_NO_PIDFD=1``, fresh forked workers, spawned ones, crashes and deadline kills
still work and leave no process behind."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kcoral_server.processes.pidfd import NO_PIDFD_ENV, open_pidfd

import kcoral

CRASH = "import os\ndef crash():\n    os._exit(3)\n"
SLEEPER = (
    "import os, time\n"
    "def sleep(record):\n"
    "    open(record, 'w').write(str(os.getpid()))\n"
    "    time.sleep(60)\n"
)
TRIVIAL = "def one():\n    return 1\n"


def program(source: str, name: str, args: list | None = None) -> kcoral.Program:
    p = kcoral.Program()
    fn = p.get_function(module=p.upload(kind="module", source=source), name=name)
    p.return_(key="out", value=p.run(fn=fn, args=args or []))
    return p


def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def test_forcing_pidfds_off_makes_open_pidfd_say_none(monkeypatch) -> None:
    monkeypatch.setenv(NO_PIDFD_ENV, "1")
    assert open_pidfd(os.getpid()) is None
    monkeypatch.delenv(NO_PIDFD_ENV)
    fd = open_pidfd(os.getpid())
    if fd is not None:  # this kernel has pidfds
        os.close(fd)


@pytest.mark.parametrize(
    "extra",
    [[], ["--max-requests-per-worker", "0"], ["--worker-memory-limit-bytes", str(1 << 31)]],
    ids=["fresh-forked-workers", "reused-worker", "with-limits"],
)
def test_a_server_without_pidfds_runs_crashes_and_kills_and_keeps_serving(
    server_factory, tmp_path, extra: list[str]
) -> None:
    server = server_factory("--max-requests-per-worker", "1", *extra, env={NO_PIDFD_ENV: "1"})
    record = tmp_path / "sleeper.pid"
    with kcoral.Client(server.url) as client:
        assert client.execute(program(TRIVIAL, "one"))["out"] == 1
        crashed = client.execute(program(CRASH, "crash"))
        assert crashed.status == "FAILED"
        assert crashed.error["message"] == (
            "worker exited while executing the instruction: it exited with status 3"
        )
        with pytest.raises(kcoral.KCoralError) as late:
            client.execute(program(SLEEPER, "sleep", [str(record)]), timeout_seconds=2)
        assert (late.value.status_code, late.value.kind) == (504, "timeout")
        assert not alive(int(record.read_text()))
        for _ in range(3):
            assert client.execute(program(TRIVIAL, "one"))["out"] == 1
