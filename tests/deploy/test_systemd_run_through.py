"""docs/scaling.md "systemd" as an operator follows it: the commands create the user the
units run as, install the ``kcoral`` their ``ExecStart`` starts, and write every file they
read, closed to others; the router then starts from its unit's command line on those
files, reloads its clients on ``systemctl reload`` (SIGHUP) and stops cleanly on SIGTERM.

Before, the units started ``/usr/local/bin/kcoral`` and nothing said how it got there:
Debian 12 and Ubuntu 23.04+ refuse a system-wide ``pip install`` (PEP 668), so an operator
who installed into a virtual environment got ``status=203/EXEC``, and one without the user
``kcoral`` got ``status=217/USER``. (systemd itself cannot run here: no PID 1 systemd.)"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import time
from pathlib import Path

import tomllib
from deploy_files import ROOT, SYSTEMD, unit_command
from kcoral_server.settings.command_line import parse_server_args
from test_systemd_units import kcoral_entry_point, service

DOCS = ROOT / "docs" / "scaling.md"
#: a hang guard, not a timing check
START_SECONDS = 60.0


def blocks() -> list[list[str]]:
    """The bash blocks of the section, as their lines: the router's, then a node's."""
    text = DOCS.read_text()
    start = text.index("## systemd\n")
    section = text[start : text.index("\n## ", start + 1)]
    found = re.findall(r"```bash\n(.*?)```", section, re.S)
    return [[line.strip() for line in block.splitlines() if line.strip()] for block in found]


def unit_of(block: list[str]) -> str:
    (name,) = {m for line in block for m in re.findall(r"deploy/systemd/(\S+\.service)", line)}
    return name


def test_each_unit_runs_as_the_user_and_starts_the_kcoral_its_block_installs() -> None:
    found = blocks()
    assert [unit_of(block) for block in found] == ["kcoral-router.service", "kcoral-node.service"]
    assert sorted(unit_of(block) for block in found) == sorted(
        path.name for path in SYSTEMD.glob("*.service")
    )
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    for block in found:
        unit = service(unit_of(block))
        text = " && ".join(block)
        assert re.search(rf"useradd --system .*\b{unit['User']}$", text.split(" && ")[0])
        (venv,) = re.findall(r"python3 -m venv (\S+)", text)
        executable = shlex.split(unit["ExecStart"])[0]
        # pip puts the project's console script in the environment's bin/
        assert executable == f"{venv}/bin/kcoral" and "kcoral" in scripts
    router_install = " ".join(found[0])
    node_install = " ".join(found[1])
    assert "'kcoral[router]'" in router_install
    assert "'kcoral[router,gpu]'" in node_install and "bubblewrap" in node_install


def written_files(block: list[str], etc: Path, router_env: Path | None = None) -> None:
    """Runs the block's lines that make /etc/kcoral and write into it, at ``etc``."""
    for line in block:
        if "/etc/kcoral" not in line or line.startswith("cp ") or line.startswith("chown "):
            continue
        line = line.replace("/etc/kcoral", str(etc))
        if router_env is not None:
            line = line.replace("/path/to/copy/of/router.env", str(router_env))
        subprocess.run(["bash", "-c", f"umask 022; {line}"], check=True, timeout=60)


def environment_file(path: Path) -> dict[str, str]:
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if line.strip())
    return {key: value for key, value in pairs}


def test_the_router_starts_reloads_and_stops_on_the_files_the_docs_write(tmp_path: Path) -> None:
    router_block, node_block = blocks()
    etc = tmp_path / "etc-kcoral"
    written_files(router_block, etc)
    unit = service("kcoral-router.service")
    command = unit_command("kcoral-router.service", kcoral_entry_point())
    read = [Path(unit["EnvironmentFile"]), Path(command[command.index("--auth-token-file") + 1])]
    for path in read:
        mine = etc / path.relative_to("/etc/kcoral")
        assert mine.is_file(), f"the docs write no {path}"
        assert mine.stat().st_mode & 0o077 == 0, f"{path} is open to others"
    # A node's token comes from the router's file, the only line of its own file.
    written_files(node_block, etc, router_env=etc / "router.env")
    node_env = environment_file(etc / Path(service("kcoral-node.service")["EnvironmentFile"]).name)
    assert node_env == environment_file(etc / "router.env")
    assert (etc / "node.env").stat().st_mode & 0o077 == 0
    node = [a.replace("%l", "gpu-host-1") for a in unit_command("kcoral-node.service", "kcoral")]
    parse_server_args(node[2:], node_env)

    command = [a.replace("/etc/kcoral", str(etc)) for a in command]
    command[command.index("--port") + 1] = "0"  # a free one: 9000 may be taken here
    env = {k: v for k, v in os.environ.items() if not k.startswith("KCORAL_")}
    env.update(environment_file(etc / "router.env"))
    log_path = tmp_path / "router.log"
    with open(log_path, "w") as log:
        router = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env)
    try:
        wait_for(router, log_path, "KCoral router listening on")
        # ExecReload: an identity added to the clients file is read without a restart
        with open(etc / "clients", "a") as clients:
            clients.write("bob b0b-token-of-the-run-through\n")
        router.send_signal(signal.SIGHUP)
        wait_for(router, log_path, "tokens_reloaded")
        router.send_signal(signal.SIGTERM)
        assert router.wait(START_SECONDS) == 0
    finally:
        if router.poll() is None:
            router.kill()
            router.wait()
    log_text = log_path.read_text()
    assert "node_token=set client_token=set" in log_text
    assert 'added=["bob"]' in log_text
    secrets = [line.split()[1] for line in (etc / "clients").read_text().splitlines()]
    secrets.append(env["KCORAL_NODE_TOKEN"])
    assert not [secret for secret in secrets if secret in log_text]


def wait_for(process: subprocess.Popen[bytes], log_path: Path, text: str) -> None:
    """Until ``text`` is in the log, failing at once with the log if ``process`` has exited
    (not waiting's ``wait_for``: a unit that failed would otherwise be waited out)."""
    deadline = time.monotonic() + START_SECONDS
    while text not in log_path.read_text():
        assert process.poll() is None, log_path.read_text()
        assert time.monotonic() < deadline, log_path.read_text()
        time.sleep(0.05)
