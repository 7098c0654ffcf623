"""The systemd units pass `systemd-analyze verify` and run commands the real parsers accept,
with the node token only in the environment file."""

from __future__ import annotations

import configparser
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from deploy_files import SYSTEMD, UNIT_KCORAL, unit_command
from kcoral_server.router.settings import parse_router_args
from kcoral_server.settings.command_line import parse_server_args

UNITS = ("kcoral-router.service", "kcoral-node.service")


def kcoral_entry_point() -> str:
    """This environment's ``kcoral`` (the units name UNIT_KCORAL, absent here)."""
    found = shutil.which("kcoral", path=str(Path(sys.executable).parent)) or shutil.which("kcoral")
    assert found, "the kcoral entry point is installed with the package"
    return found


def test_systemd_analyze_verify_accepts_both_units(tmp_path: Path) -> None:
    analyze = shutil.which("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze is missing (Debian's systemd package)")
    kcoral = kcoral_entry_point()
    copies = []
    for name in UNITS:
        text = (SYSTEMD / name).read_text()
        assert text.count(UNIT_KCORAL) == 1
        copy = tmp_path / name
        copy.write_text(text.replace(UNIT_KCORAL, kcoral))
        copies.append(str(copy))
    done = subprocess.run(
        [analyze, "verify", "--man=no", *copies],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    # verify prints nothing for a clean unit; any line is a finding (unknown directive, bad
    # value, missing command) even where the exit status stays 0.
    assert done.returncode == 0 and not done.stdout.strip() and not done.stderr.strip(), (
        done.stdout + done.stderr
    )


def service(name: str) -> configparser.SectionProxy:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    parser.read_string((SYSTEMD / name).read_text())
    return parser["Service"]


def test_the_units_take_the_node_token_from_an_environment_file(tmp_path: Path) -> None:
    for name in UNITS:
        section = service(name)
        assert section["EnvironmentFile"].startswith("/etc/kcoral/")
        assert "token" not in section["ExecStart"].lower().replace("--auth-token-file", "")
        assert section["Restart"] == "always"
    tokens = tmp_path / "clients"
    tokens.write_text("alice c-alice\nops c-ops admin\n")
    router = unit_command("kcoral-router.service", "kcoral")
    at = router.index("--auth-token-file") + 1
    settings = parse_router_args(
        [*router[2:at], str(tokens), *router[at + 1 :]], {"KCORAL_NODE_TOKEN": "t"}
    )
    node = [a.replace("%l", "gpu-host-1") for a in unit_command("kcoral-node.service", "kcoral")]
    server = parse_server_args(node[2:], {"KCORAL_NODE_TOKEN": "t"})
    assert server.config.router_endpoint.endswith(f":{settings.port}")
    assert server.config.sandbox == "bubblewrap"
    # The node drains for up to its longest program before systemd kills it.
    stop = int(service("kcoral-node.service")["TimeoutStopSec"])
    assert stop >= server.config.max_timeout_seconds + 60
    # The directories the node writes are the ones systemd creates for its user.
    section = service("kcoral-node.service")
    assert server.config.disk_cache_dir == Path("/var/cache") / section["CacheDirectory"]
    assert server.config.log_dir == Path("/var/log") / section["LogsDirectory"]


def test_the_node_unit_serves_on_a_free_loopback_port_no_other_server_can_hold() -> None:
    # It pinned 8000, the plain server's default: a `kcoral server` started on the machine
    # first made the node fail at every start (ROUTER §12) until that server stopped.
    node = [a.replace("%l", "gpu-host-1") for a in unit_command("kcoral-node.service", "kcoral")]
    server = parse_server_args(node[2:], {"KCORAL_NODE_TOKEN": "t"})
    assert server.port == 0 and server.host == "127.0.0.1"


def test_the_node_unit_delegates_its_cgroup_so_worker_limits_are_enforced() -> None:
    # Without Delegate=yes the unit's cgroup is systemd's: the front-end cannot make the
    # workers' parent limit nor their cgroups, and every per-worker limit goes unenforced.
    assert service("kcoral-node.service").get("Delegate") == "yes"


@pytest.mark.parametrize("name", UNITS)
def test_each_unit_raises_the_open_files_limit(name: str) -> None:
    # Issue 28: at the usual 1024 a few hundred idle sockets stopped ``accept``.
    assert int(service(name)["LimitNOFILE"]) >= 65536


# What the router unit locks down: the router runs no uploaded code and writes no file.
ROUTER_HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "PrivateDevices": "yes",
    "ProtectKernelTunables": "yes",
    "ProtectKernelModules": "yes",
    "ProtectKernelLogs": "yes",
    "ProtectControlGroups": "yes",
    "RestrictAddressFamilies": "AF_INET AF_INET6 AF_UNIX",
    "RestrictNamespaces": "yes",
    "LockPersonality": "yes",
    "UMask": "0077",
}


def test_the_router_unit_is_sandboxed_and_the_node_unit_keeps_namespaces_and_devices() -> None:
    # `systemd-analyze security --offline=yes` rated the router's unit 9.2 UNSAFE without these.
    router = service("kcoral-router.service")
    assert {key: router.get(key) for key in ROUTER_HARDENING} == ROUTER_HARDENING
    # ... and the router's command writes nowhere these would forbid (no ready file, no log
    # folder: its events go to the journal).
    command = unit_command("kcoral-router.service", "kcoral")
    assert not {"--ready-file", "--log-dir"} & set(command)
    # Bubblewrap makes namespaces for every worker and the workers use the GPUs' devices.
    node = service("kcoral-node.service")
    assert "RestrictNamespaces" not in node and "PrivateDevices" not in node


@pytest.mark.parametrize("name", UNITS)
def test_each_unit_points_to_the_docs_on_its_plain_http_transport(name: str) -> None:
    # ROUTER §3: no encryption; the units name where the docs say what to do about it.
    text = (SYSTEMD / name).read_text()
    assert 'docs/scaling.md, "Transport"' in text
    docs = (SYSTEMD.parents[1] / "docs" / "scaling.md").read_text()
    assert "\n## Transport\n" in docs
