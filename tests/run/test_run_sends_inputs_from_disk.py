"""``kcoral run --send``'s inputs go from disk into the request body (CLIENT_API §11): a
large input needs no client memory of its size and reaches the tool byte-identical with its
executable bit, an input changed after it was read runs nothing, and an input over the
server's stated request limit is not sent."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys

import pytest

from kcoral.local_folder import KEPT_FILE_BYTES, SentFileChanged
from kcoral.run.inputs import LocalFileError, changed_input, collect_inputs

TOKEN = "a-token-made-as-the-readme-makes-one-0123456789"
INPUT_BYTES = 128 << 20

# Runs `kcoral run` as a child and prints the child's peak resident memory in bytes last.
_PEAK_OF_A_CHILD = (
    "import resource, subprocess, sys\n"
    "done = subprocess.run(sys.argv[1:])\n"
    "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024)\n"
    "sys.exit(done.returncode)\n"
)
_SHOW_INPUTS = (
    "import hashlib, os\n"
    "print(hashlib.sha256(open('big.bin', 'rb').read()).hexdigest())\n"
    "print(oct(os.stat('tools/go.sh').st_mode & 0o777), oct(os.stat('big.bin').st_mode & 0o777))\n"
)


@pytest.fixture
def server_with_a_token(server_factory, tmp_path):
    def start(*args: str):
        token_file = tmp_path / "client.token"
        token_file.write_text(TOKEN + "\n")
        token_file.chmod(0o600)
        return server_factory("--auth-token-file", str(token_file), *args)

    return start


def kcoral_run(url: str, *argv: str, cwd) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", _PEAK_OF_A_CHILD, sys.executable, "-m", "kcoral", "run"]
    env = {**os.environ, "KCORAL_TOKEN": TOKEN}
    return subprocess.run(
        [*command, *argv[:1], "--url", url, *argv[1:]],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_a_large_input_reaches_the_tool_byte_identical_without_client_memory_of_its_size(
    server_with_a_token, tmp_path
):
    server = server_with_a_token()
    (tmp_path / "big.bin").write_bytes(os.urandom(INPUT_BYTES))
    (tmp_path / "tools").mkdir()
    (tmp_path / "tools" / "go.sh").write_text("#!/bin/sh\n")
    (tmp_path / "tools" / "go.sh").chmod(0o755)
    try:
        done = kcoral_run(
            server.url,
            "python",
            "--send",
            "big.bin",
            "--send",
            "tools",
            "--",
            "-c",
            _SHOW_INPUTS,
            cwd=tmp_path,
        )
        local = hashlib.sha256((tmp_path / "big.bin").read_bytes()).hexdigest()
    finally:
        (tmp_path / "big.bin").unlink()
    assert done.returncode == 0, done.stderr
    digest, modes, peak = done.stdout.splitlines()
    assert digest == local
    assert modes == "0o700 0o600"
    # it read the input whole, then packed a copy: over twice its size
    assert int(peak) < INPUT_BYTES, f"kcoral run peaked at {int(peak) >> 20} MiB"


def test_an_input_over_the_servers_stated_limit_is_not_sent_and_says_the_flag(
    server_with_a_token, tmp_path
):
    server = server_with_a_token("--max-request-bytes", "8M")
    (tmp_path / "big.bin").write_bytes(os.urandom(9 << 20))
    done = kcoral_run(
        server.url, "python", "--send", "big.bin", "--", "-c", "print(1)", cwd=tmp_path
    )
    assert done.returncode == 1
    # it read "request not sent: its body of 9.0 MiB (...) is over ...", HTTP's words to
    # someone who had named files
    assert done.stderr.splitlines()[-1] == (
        "kcoral run: the --send inputs come to 9.0 MiB in the request, over the server's "
        "limit of 8.0 MiB (8388608 bytes; kcoral server --max-request-bytes); nothing was sent"
    )


def test_an_input_changed_after_it_was_read_says_nothing_ran_and_to_run_again(tmp_path):
    # large enough to be read again as it is sent (a small one is sent as it was read)
    (tmp_path / "data.txt").write_bytes(b"f" * (KEPT_FILE_BYTES + 1))
    [(remote, blob, _executable)] = collect_inputs([str(tmp_path / "data.txt")])
    (tmp_path / "data.txt").write_bytes(b"o" * (KEPT_FILE_BYTES + 1))
    with pytest.raises(SentFileChanged) as changed:
        blob.read()
    assert remote == "data.txt"
    assert (changed.value.file, changed.value.reason) == (
        str(tmp_path / "data.txt"),
        "its bytes changed",
    )
    assert changed_input(changed.value) == (
        f"--send: {str(tmp_path / 'data.txt')!r} changed after kcoral run read it "
        "(its bytes changed); nothing was run: run again"
    )


def test_an_input_whose_remote_path_the_request_cannot_carry_is_refused_before_sending(tmp_path):
    (tmp_path / "a\\b.txt").write_bytes(b"x")
    with pytest.raises(LocalFileError) as refused:
        collect_inputs([str(tmp_path / "a\\b.txt")])
    assert str(refused.value) == (
        "--send: 'a\\\\b.txt' cannot be sent: path 'work/a\\\\b.txt' must not contain a backslash"
    )


def test_an_input_named_through_a_link_and_dotdot_is_the_file_the_path_opens(tmp_path, monkeypatch):
    (tmp_path / "real" / "inner").mkdir(parents=True)
    (tmp_path / "real" / "data.txt").write_bytes(b"beside the link's target")
    (tmp_path / "here").mkdir()
    (tmp_path / "here" / "link").symlink_to(tmp_path / "real" / "inner")
    (tmp_path / "here" / "data.txt").write_bytes(b"beside the link")
    monkeypatch.chdir(tmp_path / "here")
    [(remote, blob, _executable)] = collect_inputs(["link/../data.txt"])
    assert (remote, blob.read()) == ("data.txt", b"beside the link's target")
