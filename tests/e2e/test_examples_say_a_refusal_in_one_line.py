"""``examples/quickstart.py --url URL`` and ``examples/nccl_allreduce.py --url URL`` against a
real server with a client token, run as their headers say, without ``KCORAL_TOKEN``.

Before, both ended in the client's traceback (a dozen frames of ``kcoral/connection``) over
``kcoral.errors.KCoralError: HTTP 401: missing or invalid bearer token``, which named neither
the server nor the variable the header says carries its token; now one line says both, and
the script exits 1."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_process import RunningServer, running_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from router_helpers import Node, ready_nodes, start_router, stopping

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

pytestmark = pytest.mark.timeout(300)

TOKEN = secrets.token_urlsafe(24)


@pytest.fixture(scope="module")
def token_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with running_server(
        tmp_path_factory.mktemp("token-server"),
        ["--log-dir", ""],
        env={"KCORAL_AUTH_TOKEN": TOKEN},
    ) as server:
        yield server


def run_without_token(*args: str) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k != "KCORAL_TOKEN"}
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=240, env=environment
    )


@pytest.mark.parametrize(
    "example", [["quickstart.py"], ["nccl_allreduce.py", "--gpus", "2"]], ids=lambda e: e[0]
)
def test_an_example_refused_for_its_token_says_so_in_one_line_naming_kcoral_token(
    token_server: RunningServer, example: list[str]
) -> None:
    done = run_without_token(str(EXAMPLES / example[0]), "--url", token_server.url, *example[1:])
    assert done.returncode == 1, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert done.stderr.strip().splitlines() == [
        f"the server at {token_server.url} needs a token (401), and no token was sent: "
        "set KCORAL_TOKEN, or pass Client(url, token=...) "
        "[the server said: missing or invalid bearer token]"
    ]


@pytest.mark.parametrize(
    "example", [["quickstart.py"], ["nccl_allreduce.py", "--gpus", "2"]], ids=lambda e: e[0]
)
def test_an_example_given_a_bad_address_or_a_pasted_bearer_token_says_so_without_a_traceback(
    token_server: RunningServer, example: list[str]
) -> None:
    # Before: the client's ValueError traceback for both ('base_url: ...', 'KCORAL_TOKEN
    # holds a character ...').
    script = str(EXAMPLES / example[0])
    done = run_without_token(script, "--url", "127.0.0.1", *example[1:])
    assert done.returncode == 2, done.stdout + done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    assert (
        done.stderr.strip()
        .splitlines()[-1]
        .endswith(
            "error: argument --url: '127.0.0.1': the port is required (host:port, e.g. "
            "127.0.0.1:8000, or a URL such as http://host:8000)"
        )
    ), done.stderr
    environment = {**os.environ, "KCORAL_TOKEN": "Bearer not-shown-0123"}
    done = subprocess.run(
        [sys.executable, script, "--url", token_server.url, *example[1:]],
        capture_output=True, text=True, timeout=240, env=environment,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        "KCORAL_TOKEN holds a character no bearer token can hold (only printable ASCII without "
        "spaces); give the token alone, without 'Bearer '; the value is not shown: it may be "
        "a secret"
    ], done.stderr


@pytest.mark.parametrize("gpus", [[], ["--gpus", "2"]], ids=["all GPUs", "--gpus 2"])
def test_the_nccl_example_on_a_cpu_server_says_it_has_no_gpus_in_one_line(
    token_server: RunningServer, gpus: list[str]
) -> None:
    # Before, with --gpus the server's 400 was printed: "gpu_count exceeds this GPU server's
    # configured capacity", as if this CPU server had GPUs, too few.
    assert_no_gpus_said(token_server.url, gpus)


def test_the_nccl_example_through_a_router_of_cpu_nodes_says_it_has_no_gpus_in_one_line(
    tmp_path: Path,
) -> None:
    # Before: the node's 400 through the router, as on a CPU server.
    node_token = {"KCORAL_NODE_TOKEN": secrets.token_urlsafe(24)}
    router = start_router(tmp_path, env={"KCORAL_AUTH_TOKEN": TOKEN, **node_token})
    node = Node(tmp_path, router, "cpu-a", node_token)
    with stopping(router, [node]):
        ready_nodes(router, 1)
        assert_no_gpus_said(router.url, ["--gpus", "2"])


def assert_no_gpus_said(url: str, gpus: list[str]) -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLES / "nccl_allreduce.py"), "--url", url, *gpus],
        capture_output=True, text=True, timeout=240, env={**os.environ, "KCORAL_TOKEN": TOKEN},
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.strip().splitlines() == [
        f"{url} runs programs on the CPU and has no GPUs; this example needs a GPU server "
        "with at least 2 GPUs"
    ], done.stderr
