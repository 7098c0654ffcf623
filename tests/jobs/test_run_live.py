"""``kcoral run`` with live output through jobs (EXTENSIONS §7), and without jobs."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from waiting import wait_for_file

from kcoral.client import Client
from kcoral.run import command as run_cli

LIVE = (
    "import os, time; print('first', flush=True); open(os.environ['MARK'], 'w').close()\n"
    "while not os.path.exists(os.environ['GO']): time.sleep(0.01)\n"
    "print('second')"
)


def test_kcoral_run_prints_the_tools_output_while_it_runs(kcoral_server, tmp_path: Path) -> None:
    mark, go = tmp_path / "mark", tmp_path / "go"
    command = [
        sys.executable, "-m", "kcoral", "run", "python", "--url", kcoral_server.url,
        "-e", f"MARK={mark}", "-e", f"GO={go}", "--", "-c", LIVE,
    ]  # fmt: skip
    client = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert client.stdout is not None
        # The tool is still waiting for `go`: this line can only have come live.
        assert client.stdout.readline() == b"first\n"
        wait_for_file(mark, 60.0)
        go.touch()
        out, err = client.communicate(timeout=60)
    finally:
        if client.poll() is None:
            client.kill()
            client.wait()
    assert client.returncode == 0, err
    assert out == b"second\n"


def test_kcoral_run_with_jobs_prints_the_output_once(
    kcoral_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd
) -> None:
    monkeypatch.chdir(tmp_path)
    used: list[str] = []
    submit = Client.submit
    monkeypatch.setattr(Client, "submit", lambda *a, **k: used.append("submit") or submit(*a, **k))
    code = "import sys; print('out é'); print('err', file=sys.stderr); sys.exit(3)"
    status = run_cli.main(["python", "--url", kcoral_server.url, "--", "-c", code])
    captured = capfd.readouterr()
    assert status == 3 and used == ["submit"]
    assert captured.out == "out é\n"
    assert captured.err == "err\n"


def test_kcoral_run_without_jobs_keeps_the_plain_execute_path(
    kcoral_server, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(Client, "info", lambda self: {"features": ["serialization"]})

    def no_submit(*args: object, **kwargs: object) -> None:
        raise AssertionError("submit must not be used without feature jobs")

    monkeypatch.setattr(Client, "submit", no_submit)
    status = run_cli.main(["python", "--url", kcoral_server.url, "--", "-c", "print('plain')"])
    captured = capfd.readouterr()
    assert status == 0
    assert captured.out == "plain\n"
    with Client(kcoral_server.url) as client:
        assert client.request("GET", "/v1/jobs").data == b"[]"  # no job was made
