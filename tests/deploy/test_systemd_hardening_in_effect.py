"""The systemd units' hardening, in effect with real mounts (systemd itself cannot run here:
no PID 1 systemd, so bubblewrap and ``unshare`` make what the options would make):

* the router unit's ``ProtectSystem=strict``, ``PrivateTmp`` and ``ProtectHome`` leave it a
  read-only filesystem: the real router, started from the unit's command under one, serves
  a program from a real node, reloads its clients and stops cleanly;
* the node unit sets none of the options that lay mounts over part of ``/proc``
  (``ProtectKernelTunables``, ``ProtectKernelLogs``, ...): under any such mount the kernel
  refuses bubblewrap a fresh ``/proc`` (``Can't mount proc on /newroot/proc``), so every
  worker of ``--sandbox bubblewrap`` would fail to start; nor the ones that take away what
  bubblewrap, the GPUs or ``Delegate=yes`` need.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil
import pytest
from deploy_files import shown_again, unit_command
from slurm_cluster import stop_tree
from test_systemd_units import kcoral_entry_point, service

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from router_helpers import Node, RouterProcess, ready_nodes

import kcoral

#: a hang guard, not a timing check
START_SECONDS = 60.0
NODE_TOKEN = "node-token-of-the-hardening-test"
CLIENT_TOKEN = "client-token-of-alice-0123456789"
ROOT_ONLY = pytest.mark.skipif(
    os.geteuid() != 0, reason="bubblewrap builds the unit's mounts only for root here"
)


def bubblewrap() -> str:
    found = shutil.which("bwrap")
    if found is None:
        pytest.skip("bubblewrap is missing (Debian's bubblewrap package)")
    return found


def read_only_as_the_router_unit(etc: Path) -> list[str]:
    """bubblewrap's mounts for the router unit's filesystem options: the whole tree
    read-only (``ProtectSystem=strict``), an empty private ``/tmp`` (``PrivateTmp``) and
    ``/home`` (``ProtectHome``; ``/root`` stays, where this test's Python lives, while the
    unit's lives in ``/opt/kcoral``), ``/etc/kcoral`` here read-only under /tmp."""
    return [
        bubblewrap(),
        "--ro-bind",
        "/",
        "/",
        "--dev",
        "/dev",
        "--proc",
        "/proc",
        "--tmpfs",
        "/tmp",
        "--tmpfs",
        "/home",
        *shown_again([Path("/tmp"), Path("/home")]),
        "--ro-bind",
        str(etc),
        "/tmp/etc-kcoral",
        "--die-with-parent",
        "--",
    ]


@contextmanager
def hardened_router(tmp_path: Path) -> Iterator[tuple[RouterProcess, psutil.Process]]:
    """The router unit's command under its read-only filesystem, and the router process."""
    etc = tmp_path / "etc-kcoral"
    etc.mkdir(mode=0o700)
    (etc / "clients").write_text(f"alice {CLIENT_TOKEN}\n")
    (etc / "clients").chmod(0o600)
    command = unit_command("kcoral-router.service", kcoral_entry_point())
    command = [a.replace("/etc/kcoral", "/tmp/etc-kcoral") for a in command]
    command[command.index("--host") + 1] = "127.0.0.1"
    command[command.index("--port") + 1] = "0"  # a free one: 9000 may be taken here
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCORAL_")}
    env["KCORAL_NODE_TOKEN"] = NODE_TOKEN
    log_path = tmp_path / "router.log"
    with open(log_path, "w") as log:
        wrapper = subprocess.Popen(
            [*read_only_as_the_router_unit(etc), *command],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            text=True,
        )
    try:
        url = listening_url(wrapper, log_path)
        (router,) = [
            child
            for child in psutil.Process(wrapper.pid).children(recursive=True)
            if "router" in child.cmdline()
        ]
        yield RouterProcess(url, int(url.rsplit(":", 1)[1]), wrapper, log_path), router
    finally:
        stop_tree(wrapper)  # killing bubblewrap alone leaves its command running


def listening_url(process: subprocess.Popen[str], log_path: Path) -> str:
    deadline = time.monotonic() + START_SECONDS
    while True:
        for line in log_path.read_text().splitlines():
            if line.startswith("KCoral router listening on "):
                return line.split()[-1]
        assert process.poll() is None, log_path.read_text()
        assert time.monotonic() < deadline, log_path.read_text()
        time.sleep(0.05)


@ROOT_ONLY
def test_the_router_serves_reloads_and_stops_on_the_read_only_filesystem_of_its_unit(
    tmp_path: Path,
) -> None:
    with hardened_router(tmp_path) as (router, process):
        node = Node(tmp_path, router, "n1", {"KCORAL_NODE_TOKEN": NODE_TOKEN})
        try:
            ready_nodes(router, 1)
            program = kcoral.Program()
            module = program.upload(kind="module", source="def one():\n    return 1\n")
            one = program.get_function(module=module, name="one")
            program.return_(key="one", value=program.run(fn=one))
            with kcoral.Client(router.url, token=CLIENT_TOKEN) as client:
                assert client.execute(program)["one"] == 1
        finally:
            node.stop()
        process.send_signal(signal.SIGHUP)  # ExecReload
        router.wait_log("tokens_reloaded", START_SECONDS)
        process.send_signal(signal.SIGTERM)
        assert router.process.wait(START_SECONDS) == 0
    log = router.log()
    assert "tokens_reloaded" in log and "router_stopped" in log
    assert "Read-only file system" not in log and "ERROR" not in log, log


def fresh_proc_under(cover: str) -> subprocess.CompletedProcess[str]:
    """bubblewrap, as an unprivileged user, making a worker's fresh ``/proc`` in a mount
    namespace where ``cover`` (a shell command, or nothing) has laid a mount over part of
    ``/proc`` as a systemd option would."""
    script = f"{cover} && " if cover else ""
    script += (
        "exec setpriv --reuid=65534 --regid=65534 --clear-groups "
        f"{bubblewrap()} --unshare-all --ro-bind / / --dev /dev --proc /proc true"
    )
    return subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


# What systemd lays over /proc for each option (systemd.exec(5)), as a shell command.
PROC_COVERS = {
    "ProtectKernelLogs": "mount --bind /dev/null /proc/kmsg",
    "ProtectKernelTunables": "mount --bind /proc/sys /proc/sys && "
    "mount -o remount,bind,ro /proc/sys",
}


@ROOT_ONLY
@pytest.mark.parametrize("option", sorted(PROC_COVERS))
def test_bubblewrap_gets_no_fresh_proc_under_the_mounts_of_an_option_the_node_unit_leaves_off(
    option: str,
) -> None:
    for program in ("unshare", "setpriv"):
        if shutil.which(program) is None:
            pytest.skip(f"{program} is missing (Debian's util-linux)")
    uncovered = fresh_proc_under("")
    if uncovered.returncode != 0:
        pytest.skip(f"bubblewrap cannot run here at all: {uncovered.stderr.strip()}")
    covered = fresh_proc_under(PROC_COVERS[option])
    assert covered.returncode != 0
    assert "Can't mount proc" in covered.stderr, covered.stderr
    assert option not in service("kcoral-node.service")


# Each takes away what the node needs: mounts over /proc (above; ProtectProc and ProcSubset
# mount a /proc of their own), a read-only cgroup tree (Delegate=yes hands the node its
# cgroup to write), no namespaces or mount calls (bubblewrap), no devices (the GPUs), no
# writable executable memory (the CUDA and Triton JITs).
NODE_NEEDS_OFF = (
    *PROC_COVERS,
    "ProtectProc",
    "ProcSubset",
    "ProtectControlGroups",
    "RestrictNamespaces",
    "SystemCallFilter",
    "PrivateDevices",
    "DevicePolicy",
    "MemoryDenyWriteExecute",
)


def test_the_node_unit_sets_no_option_that_takes_away_what_its_workers_need() -> None:
    node = service("kcoral-node.service")
    assert [option for option in NODE_NEEDS_OFF if option in node] == []
    assert node.get("Delegate") == "yes"
