"""Attack: another local user plants a link where a server or router will write its URL.

``--ready-file`` is often a path in a folder everyone may write (``/tmp``). The server wrote
the URL to ``.NAME.tmp`` next to it first, a name known in advance, and the router and a
node's supervisor straight to the path, both through whatever link was there: a link
planted before the start, pointing at one of the user's files, had that file overwritten
with the URL (where the system does not forbid following links in sticky folders, as
``fs.protected_symlinks=0`` in many containers). Now the URL goes into a new file of a
random name, never opened through a link, renamed over the path.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import time
from pathlib import Path

from kcoral_server.storage.ready_file import ready_file_write_problem
from server_process import start_server

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))
from router_helpers import node_command, start_router

PRECIOUS = "the user's own file\n"


def _shared_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "shared"
    folder.mkdir()
    folder.chmod(0o1777)  # as /tmp
    return folder


def _victim(tmp_path: Path) -> Path:
    victim = tmp_path / "home" / ".bashrc"
    victim.parent.mkdir()
    victim.write_text(PRECIOUS)
    return victim


def test_a_link_planted_at_the_servers_temporary_ready_name_is_not_written_through(
    tmp_path: Path,
) -> None:
    folder, victim = _shared_folder(tmp_path), _victim(tmp_path)
    (folder / ".ready.tmp").symlink_to(victim)  # start_server's --ready-file is folder/ready
    server = start_server(folder, [])
    try:
        written = (folder / "ready").read_text()
    finally:
        server.stop()
    assert victim.read_text() == PRECIOUS
    assert written == server.url + "\n"
    assert not (folder / "ready").is_symlink()


def test_a_link_planted_at_the_routers_ready_file_is_replaced_not_written_through(
    tmp_path: Path,
) -> None:
    folder, victim = _shared_folder(tmp_path), _victim(tmp_path)
    ready = folder / "router.url"
    ready.symlink_to(victim)
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KCORAL_")}
    command = [sys.executable, "-m", "kcoral", "router", "--port", "0", "--ready-file", str(ready)]
    with open(tmp_path / "router.log", "w") as log:
        router = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=environment)
    try:
        deadline = time.monotonic() + 60
        while not ready.read_text().startswith("http") and router.poll() is None:
            assert time.monotonic() < deadline, (tmp_path / "router.log").read_text()
            time.sleep(0.05)
    finally:
        router.terminate()
        router.wait(30)
    assert victim.read_text() == PRECIOUS, (tmp_path / "router.log").read_text()
    assert not ready.is_symlink()
    assert ready.read_text().startswith("http://127.0.0.1:")


def _started(command: list[str], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("KCORAL_")}
    return subprocess.run(
        command, capture_output=True, text=True, env=environment, cwd=tmp_path, timeout=120
    )


def test_a_ready_file_that_cannot_be_written_stops_the_server_and_router_in_one_line(
    tmp_path: Path,
) -> None:
    # Another user's link at the path in a sticky folder refuses the rename (EPERM); the
    # server, already listening, died with a traceback, and the router too. Whoever waits
    # for the file would wait for ever, so each says why in one line and exits 1. /sys
    # refuses a new file to root too, after the start's checks of the path have passed.
    ready = Path("/sys/kcoral-ready")
    server = [sys.executable, "-m", "kcoral", "server", "--device", "cpu", "--port", "0"]
    router = [sys.executable, "-m", "kcoral", "router", "--port", "0"]
    for name, command in (("server", [*server, "--log-dir", ""]), ("router", router)):
        done = _started([*command, "--ready-file", str(ready)], tmp_path)
        assert done.returncode == 1, done.stderr
        assert "Traceback" not in done.stderr, done.stderr
        said = f"kcoral {name}: cannot write --ready-file {ready}: Permission denied\n"
        assert said in done.stderr, done.stderr


def test_a_refused_replacement_of_the_ready_file_says_whose_entry_may_be_there() -> None:
    refused = PermissionError(errno.EPERM, "Operation not permitted")
    assert ready_file_write_problem("/tmp/kcoral.url", refused) == (
        "cannot write --ready-file /tmp/kcoral.url: Operation not permitted"
        " (another user's file or link may be there: choose a path of your own)"
    )


def test_a_nodes_ready_file_that_cannot_be_written_stops_the_node_in_one_line(
    tmp_path: Path,
) -> None:
    # the node supervisor writes it once its server answers: the same rule as the server's
    # and the router's (EXTENSIONS §2), untested until now
    ready = Path("/sys/kcoral-node-ready")
    router = start_router(tmp_path)
    try:
        command = node_command(tmp_path, router.url, "ready-node", "--ready-file", str(ready))
        done = _started(command, tmp_path)
    finally:
        router.stop()
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    said = f"kcoral server --router: cannot write --ready-file {ready}: Permission denied\n"
    assert said in done.stderr, done.stderr
