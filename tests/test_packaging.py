"""Packaging promises: `import kcoral` stays thin, the commands and the version work.

What `pip install .`, `pip install -e .` and `pip wheel .` put where is in
tests/packaging/test_pip_installs.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_import_kcoral_loads_no_server_torch_jupyter_or_grpc_module() -> None:
    code = (
        "import sys, kcoral\n"
        "from kcoral import Client, Program, Register, ProgramResult, ReturnedFile,"
        " ReturnedFolder, KCoralError, TransportError, ProtocolError, RemoteExecutionError,"
        " ServerConfig, parse_program\n"
        "heavy = ('tornado', 'torch', 'jupyter', 'jupyter_server', 'IPython', 'ipykernel',"
        " 'grpc', 'google.protobuf', 'tvm_ffi', 'kcoral_server.front_door.app')\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy or m in heavy))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_the_kcoral_command_prints_its_usage_and_fails_without_a_sub_command() -> None:
    bare = subprocess.run([sys.executable, "-m", "kcoral"], capture_output=True, text=True)
    assert bare.returncode == 2 and bare.stdout == ""
    assert "server" in bare.stderr and "router" in bare.stderr and "run" in bare.stderr
    out = subprocess.run(
        [sys.executable, "-m", "kcoral", "--help"], capture_output=True, text=True, check=True
    ).stdout
    assert "server" in out and "router" in out and "run" in out


def test_the_version_is_the_installed_distribution_version() -> None:
    from importlib.metadata import version

    import kcoral

    assert kcoral.__version__ == version("kcoral")


def test_test_modules_have_unique_basenames() -> None:
    # The test folders are not packages, so pytest imports test modules by basename.
    names = [
        p.name
        for p in (ROOT / "tests").rglob("*.py")
        if p.name not in ("conftest.py", "__init__.py")
    ]
    assert sorted({n for n in names if names.count(n) > 1}) == []


def test_a_node_started_without_the_router_extra_says_which_extra_to_install() -> None:
    # `pip install 'kcoral[server]'` has no grpcio, which a node needs to reach its router:
    # the command says so in one line, as `kcoral router` does, instead of a traceback.
    hide_grpc = (
        "import sys\n"
        "sys.modules['grpc'] = None  # as if grpcio were not installed\n"
        "from kcoral.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    node_args = ["--router", "http://127.0.0.1:9", "--node-id", "n1", "--device", "cpu"]
    node = subprocess.run(
        [sys.executable, "-c", hide_grpc, "server", *node_args, "--port", "0", "--log-dir", ""],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert node.returncode == 1, node.stderr
    assert "Traceback" not in node.stderr
    assert node.stderr == (
        "kcoral: missing dependency (grpc); a node of a router needs the router stack: "
        "pip install 'kcoral[router]'\n"
    )


def test_kcoral_router_help_without_the_router_extra_says_what_to_install() -> None:
    # ``--help`` lists flags the router's modules define, so it needs them too: one line
    # naming the command and the extra, never the server's "stack" or a traceback.
    hide_grpc = (
        "import sys\n"
        "sys.modules['grpc'] = None  # as if grpcio were not installed\n"
        "from kcoral.cli import main\n"
        "sys.exit(main(sys.argv[1:]))\n"
    )
    router = subprocess.run(
        [sys.executable, "-c", hide_grpc, "router", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert router.returncode == 1 and router.stdout == ""
    assert router.stderr == (
        "kcoral router: missing dependency (grpc); install it with: pip install 'kcoral[router]'\n"
    )
