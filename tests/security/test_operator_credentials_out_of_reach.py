"""Another token holder's program cannot read the operator's credentials from the server's
environment (SERVER §14, EXTENSIONS §6; ``processes/credentials.py``).

The attack, performed: the operator starts a server for alice and bob with their cloud key,
Hugging Face token and SSH agent in the environment, as a shell that has them would; bob
sends a program that reads its environment. Before, it got ``AWS_SECRET_ACCESS_KEY``,
``HF_TOKEN`` and ``SSH_AUTH_SOCK`` (even under bubblewrap). A server one person uses keeps
passing them: they are that person's own.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from identity_support import TOKEN_A, TOKEN_B, token_file
from server_process import start_server

import kcoral

pytestmark = pytest.mark.slow
OPERATOR_ENV = {
    "AWS_SECRET_ACCESS_KEY": "operator-aws-secret",
    "HF_TOKEN": "operator-hf-token",
    "SSH_AUTH_SOCK": "/run/user/0/operator-agent.sock",
    "DB_PASSWORD": "operator-db-password",
    "KCORAL_TEST_PLAIN": "plain-value",
}
READ_ENVIRONMENT = """
import os
def main():
    return {name: os.environ.get(name) for name in NAMES}
""".replace("NAMES", repr(sorted(OPERATOR_ENV)))


def environment_seen(url: str, token: str) -> dict[str, str | None]:
    program = kcoral.Program()
    module = program.upload(kind="module", source=READ_ENVIRONMENT)
    main = program.get_function(module=module, name="main")
    program.return_(key="env", value=program.run(fn=main))
    with kcoral.Client(url, token=token) as client:
        result = client.execute(program, serialization="json")
    assert result.completed, result.error
    return result.results["env"]


@pytest.mark.parametrize("sandbox", ["none", "auto"])
def test_bobs_program_gets_none_of_the_operators_credentials(tmp_path: Path, sandbox: str) -> None:
    tokens = token_file(tmp_path / "tokens")
    server = start_server(
        tmp_path / "server",
        ["--auth-token-file", str(tokens), "--sandbox", sandbox, "--worker-env-allow", "HF_*"],
        env=OPERATOR_ENV,
    )
    try:
        seen = environment_seen(server.url, TOKEN_B)
        assert seen["AWS_SECRET_ACCESS_KEY"] is None and seen["DB_PASSWORD"] is None
        assert seen["SSH_AUTH_SOCK"] is None
        assert seen["HF_TOKEN"] == "operator-hf-token"  # the operator passed it on by name
        assert seen["KCORAL_TEST_PLAIN"] == "plain-value"  # not a credential: untouched
        assert environment_seen(server.url, TOKEN_A) == seen
        withheld = [e for e in server.events() if e["event"] == "worker_env_withheld"]
        assert withheld and withheld[0]["names"] == [
            "AWS_SECRET_ACCESS_KEY",
            "DB_PASSWORD",
            "SSH_AUTH_SOCK",
        ]
        log = "".join(p.read_text() for p in server.log_dir.glob("runs/*/events.jsonl"))
        assert "operator-aws-secret" not in log and "operator-db-password" not in log
    finally:
        server.stop()


def test_a_server_one_person_uses_passes_that_persons_credentials_on(tmp_path: Path) -> None:
    server = start_server(tmp_path / "server", ["--num-workers", "1"], env=OPERATOR_ENV)
    try:
        seen = environment_seen(server.url, "")
        assert seen["AWS_SECRET_ACCESS_KEY"] == "operator-aws-secret"
        assert seen["SSH_AUTH_SOCK"] == "/run/user/0/operator-agent.sock"
        assert not [e for e in server.events() if e["event"] == "worker_env_withheld"]
    finally:
        server.stop()


def test_a_server_without_a_token_off_loopback_withholds_them_from_whoever_calls(
    tmp_path: Path,
) -> None:
    args = ["--host", "0.0.0.0", "--allow-unauthenticated", "--num-workers", "1"]
    server = start_server(tmp_path / "server", args, env=OPERATOR_ENV)
    try:
        seen = environment_seen(server.url, "")  # anyone who reaches the port, no token
        assert seen["AWS_SECRET_ACCESS_KEY"] is None and seen["SSH_AUTH_SOCK"] is None
        assert seen["KCORAL_TEST_PLAIN"] == "plain-value"
        withheld = [e for e in server.events() if e["event"] == "worker_env_withheld"]
        assert withheld and withheld[0]["message"].startswith("several people reach")
    finally:
        server.stop()


def test_a_node_behind_a_router_withholds_them_as_its_callers_are_the_routers() -> None:
    from kcoral_server.processes.credentials import withheld_credentials

    environ = {**OPERATOR_ENV, "PATH": "/usr/bin"}
    assert withheld_credentials(environ, None) == [
        "AWS_SECRET_ACCESS_KEY",
        "DB_PASSWORD",
        "HF_TOKEN",
        "SSH_AUTH_SOCK",
    ]
    assert withheld_credentials(environ, 1) == []
    assert withheld_credentials(environ, 2, ["HF_TOKEN", "AWS_*"]) == [
        "DB_PASSWORD",
        "SSH_AUTH_SOCK",
    ]


def test_tokenizers_parallelism_is_no_credential_but_a_tokenizer_token_is() -> None:
    from kcoral_server.processes.credentials import withheld_credentials

    environ = {"TOKENIZERS_PARALLELISM": "false", "TOKENIZER_HUB_TOKEN": "secret"}
    assert withheld_credentials(environ, 2) == ["TOKENIZER_HUB_TOKEN"]


def test_a_reload_that_brings_a_second_identity_warns_that_programs_keep_them(
    tmp_path: Path,
) -> None:
    """Decided at start: a server started for one identity, whose token file a reload
    (SIGHUP) turns into two, still passes the credentials on until it restarts, and its
    log says so (review: it said nothing)."""
    import signal
    import time

    tokens = token_file(tmp_path / "tokens", f"{TOKEN_A}\n")  # one bare token: one person
    server = start_server(tmp_path / "server", ["--auth-token-file", str(tokens)], env=OPERATOR_ENV)
    try:
        token_file(tmp_path / "tokens", f"alice {TOKEN_A}\nbob {TOKEN_B}\n")
        server.process.send_signal(signal.SIGHUP)
        deadline = time.monotonic() + 30
        kept: list[dict] = []
        while not kept and time.monotonic() < deadline:
            kept = [e for e in server.events() if e["event"] == "worker_env_kept"]
            time.sleep(0.1)
        assert kept and kept[0]["level"] == "WARNING", server.events()[-3:]
        assert kept[0]["names"] == [
            "AWS_SECRET_ACCESS_KEY",
            "DB_PASSWORD",
            "HF_TOKEN",
            "SSH_AUTH_SOCK",
        ]
        assert "until it restarts" in kept[0]["message"]
    finally:
        server.stop()
