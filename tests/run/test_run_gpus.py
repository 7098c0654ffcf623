"""`kcoral run --gpus N` runs the tool once with a set of N GPUs (CLIENT_API §11, PROTOCOL
§6.5), against a real server on fake GPUs: what torchrun or an NCCL test needs, which
`kcoral run` could not ask for (every tool got one GPU)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from server_process import running_server
from stand_in_http import StandIn, serving

from kcoral.run.arguments import parse_command_line
from kcoral.run.command import execute, main

SHOWS_ITS_GPUS = "import os; print(os.environ.get('CUDA_VISIBLE_DEVICES'))"
TWO_FAKE_GPUS = ["--device", "fake-gpu", "--fake-gpu-count", "2", "--workers-per-gpu", "1"]


@pytest.fixture(scope="module")
def two_gpu_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with running_server(tmp_path_factory.mktemp("gpus"), TWO_FAKE_GPUS) as server:
        yield server.url


def kcoral_run(url: str, *options: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-m", "kcoral", "run", "python", "--url", url, *options]
    return subprocess.run(
        [*command, "--", "-c", SHOWS_ITS_GPUS], capture_output=True, text=True, timeout=120
    )


@pytest.mark.slow
def test_gpus_two_gives_the_tool_a_set_of_two_gpus(two_gpu_server: str, tmp_path: Path) -> None:
    done = kcoral_run(two_gpu_server, "--gpus", "2")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "0,1\n"


@pytest.mark.slow
def test_without_gpus_the_tool_gets_one_gpu(two_gpu_server: str) -> None:
    done = kcoral_run(two_gpu_server)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() in ("0", "1")


@pytest.mark.slow
def test_more_gpus_than_the_server_has_says_how_many_it_has(two_gpu_server: str) -> None:
    # Before: "server error: HTTP 400: gpu_count exceeds this GPU server's configured
    # capacity", which left the user to find how many it has.
    done = kcoral_run(two_gpu_server, "--gpus", "3")
    assert done.returncode == 1
    assert done.stderr == (
        f"kcoral run: --gpus 3: the server at {two_gpu_server} has 2 GPUs (sm_90a); ask for no "
        "more, or give a bigger server's --url\n"
    )


class GpusBeyondAMaliciousServer(StandIn):
    """A server that refuses --gpus and names its GPU kind with a terminal escape (OSC 52
    writes the clipboard), which could as well be a megabyte long."""

    def do_GET(self) -> None:
        if self.path == "/health":
            arch = "sm_90a\x1b]52;c;ZWNobyBwd25lZA==\x07"
            self.send_json({"status": "ok", "gpu_count": 2, "target": {"arch": arch}})
        else:
            self.send_json({"kcoral": "0.1.0", "protocol": 1, "features": [], "device": "gpu"})

    def do_POST(self) -> None:
        self.read_body()
        error = {"kind": "parse", "message": "gpu_count exceeds this GPU server's capacity"}
        self.send_json({"status": "ERROR", "request_id": "r1", "error": error}, 400)


def test_a_malicious_servers_gpu_kind_reaches_the_terminal_screened() -> None:
    with serving(GpusBeyondAMaliciousServer) as url:
        done = kcoral_run(url, "--gpus", "3")
    assert done.returncode == 1
    assert done.stderr == (  # the kind is left out: not a name fit to be shown
        f"kcoral run: --gpus 3: the server at {url} has 2 GPUs; ask for no more, or give a "
        "bigger server's --url\n"
    )


@pytest.mark.slow
def test_gpus_for_a_cpu_server_says_it_has_none_before_running(server_url: str) -> None:
    # its 400 read "gpu_count exceeds this GPU server's configured capacity"
    done = kcoral_run(server_url, "--gpus", "2")
    assert done.returncode == 1
    assert done.stderr == (
        "kcoral run: --gpus 2: this server runs programs on the CPU and has no GPUs; leave "
        "--gpus out, or give a GPU server's --url\n"
    )


@pytest.mark.slow
def test_gpus_with_a_selector_for_a_direct_cpu_server_says_it_has_none_before_running(
    server_url: str,
) -> None:
    # A direct server is the node the selector is matched against. Before: its 400 "gpu_count
    # exceeds this GPU server's configured capacity", as if it were a GPU server with too few.
    done = kcoral_run(server_url, "--gpus", "2", "--select", "gpu=cpu")
    assert done.returncode == 1
    assert done.stderr == (
        "kcoral run: --gpus 2: this server runs programs on the CPU and has no GPUs; leave "
        "--gpus out, or give a GPU server's --url\n"
    )


class RouterOfCpuNodesByDefault:
    """A router whose default kind is a CPU node: its /v1/info says device cpu, while a
    selector reaches its GPU nodes (ROUTER §6)."""

    def __init__(self, url: str) -> None:
        self.sent: dict[str, object] = {}

    def __enter__(self) -> RouterOfCpuNodesByDefault:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def info(self) -> dict[str, object]:
        kinds = [{"gpu": "cpu", "gpus": 0, "nodes": 1, "default": True}]  # its fleet: a router
        return {"device": "cpu", "features": [], "fleet": {"kinds": kinds, "labels": []}}

    def execute(self, program: object, **options: object) -> str:
        self.sent = options
        return "ran"


def test_gpus_with_a_selector_is_sent_whatever_the_routers_default_kind_is(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # before: refused as "this server runs programs on the CPU" before asking any node
    router = RouterOfCpuNodesByDefault("")
    monkeypatch.setattr("kcoral.client.Client", lambda url, **_options: router)
    options = parse_command_line(
        [
            "python",
            "--url",
            "http://127.0.0.1:29403",
            "--gpus",
            "2",
            "--select",
            "gpu=h100",
            "--",
            "-c",
            "1",
        ],
        {},
    )
    assert execute(options, object()) == "ran"
    assert router.sent["gpu_count"] == 2 and router.sent["select"] == options.select


class MixedFleetRouter(RouterOfCpuNodesByDefault):
    """A router whose default kind is a CPU node, with GPU nodes of two kinds besides."""

    def info(self) -> dict[str, object]:
        kinds = [
            {"gpu": "cpu", "gpus": 0, "nodes": 1, "default": True},
            {"gpu": "h100", "gpus": 8, "nodes": 2, "default": False},
            {"gpu": "a100", "gpus": 4, "nodes": 1, "default": False},
            {"gpu": "\x1b]52;c;aGk=\x07", "gpus": 1, "nodes": 1, "default": False},
        ]
        return {"device": "cpu", "features": [], "fleet": {"kinds": kinds, "labels": []}}


def test_gpus_through_a_router_whose_default_kind_is_cpu_names_its_gpu_kinds(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # It said "this server runs programs on the CPU and has no GPUs" of a fleet with GPU
    # nodes, which --select reaches; a kind name that is no selector word is not shown.
    router = MixedFleetRouter("")
    monkeypatch.setattr("kcoral.client.Client", lambda url, **_options: router)
    argv = ["python", "--url", "http://127.0.0.1:29403", "--gpus", "2", "--", "-c", "1"]
    assert main(argv) == 1
    assert capsys.readouterr().err == (
        "kcoral run: --gpus 2: this router's default nodes run programs on the CPU; its GPU "
        "nodes take --select gpu=h100 or --select gpu=a100\n"
    )
    assert router.sent == {}  # nothing was run
