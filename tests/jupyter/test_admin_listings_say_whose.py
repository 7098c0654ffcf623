"""An admin's ``%kcoral jobs`` and ``%kcoral session list`` on a team's server (a real CPU
server whose token file names alice, bob and an admin): the admin sees every identity's
jobs and sessions (EXTENSIONS §6, §11), and each row says whose it is. Before, the rows of
alice's and bob's work were mixed with nothing to tell them apart, so the admin could not
tell which job to cancel or which session to end."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from IPython.utils.capture import capture_output
from kcoral_shell import kcoral_shell
from server_process import client_token_file, running_server

from kcoral import Client, Program

pytestmark = pytest.mark.timeout(120)

TOKENS = {"alice": "token-alice-0123456789", "bob": "token-bob-0123456789"}
ADMIN = "token-root-0123456789"


@pytest.fixture(scope="module")
def team_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """Two session seats (one each), alice's and bob's finished jobs and live sessions."""
    directory = tmp_path_factory.mktemp("team-admin")
    lines = "".join(f"{name} {token}\n" for name, token in TOKENS.items())
    tokens = client_token_file(directory, f"{lines}root {ADMIN} admin\n")
    args = ["--log-dir", "", "--num-workers", "1", "--max-sessions", "2"]
    with running_server(directory / "server", [*args, "--auth-token-file", str(tokens)]) as server:
        program = Program()
        program.upload(kind="bytes", value=b"x", id="x")
        clients = [Client(server.url, token=token) for token in TOKENS.values()]
        sessions = [client.session() for client in clients]
        for client in clients:
            client.submit(program).wait()
        try:
            yield server.url
        finally:
            for session in sessions:
                session.close()


@pytest.fixture
def admin_shell(team_server: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    with kcoral_shell(team_server, monkeypatch, ()) as ip:
        ip.run_line_magic("config", f"KCoral.token = {ADMIN!r}")
        yield ip


def test_an_admins_jobs_table_names_each_jobs_owner(admin_shell) -> None:
    with capture_output() as captured:
        admin_shell.run_line_magic("kcoral", "jobs")
    header, *rows = captured.outputs[-1].data["text/plain"].splitlines()
    assert header.split()[:3] == ["job", "status", "owner"]
    assert sorted(row.split()[2] for row in rows) == ["alice", "bob"]


def test_an_admins_session_list_names_each_sessions_owner(admin_shell) -> None:
    with capture_output() as captured:
        admin_shell.run_line_magic("kcoral", "session list")
    lines = captured.stdout.splitlines()
    assert sorted(line.rsplit(" ", 1)[1] for line in lines) == ["alice", "bob"]
    assert all("  owner " in line for line in lines)


def test_one_users_own_listings_stay_as_they_were(team_server, monkeypatch) -> None:
    with kcoral_shell(team_server, monkeypatch, ()) as ip:
        ip.run_line_magic("config", f"KCoral.token = {TOKENS['alice']!r}")
        with capture_output() as captured:
            ip.run_line_magic("kcoral", "jobs")
            ip.run_line_magic("kcoral", "session list")
    header = captured.outputs[-1].data["text/plain"].splitlines()[0]
    assert header.split() == ["job", "status", "worker", "GPUs", "submitted", "took"]
    assert "owner" not in captured.stdout


def test_an_owner_that_is_no_name_is_shown_as_unknown_not_a_crash() -> None:
    # a server's answer is not trusted: a list there made the set of owners raise TypeError
    from kcoral_jupyter.magics.jobs import UNKNOWN, owner_of

    assert owner_of({"owner": ["alice"]}) is None
    assert owner_of({"owner": ""}) is None and owner_of({}) is None
    assert owner_of({"owner": "bob"}) == "bob"
    assert {owner_of(r) for r in ({"owner": ["x"]}, {"owner": {"y": 1}})} == {None}
    assert UNKNOWN
