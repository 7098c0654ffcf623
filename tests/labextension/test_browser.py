"""The JupyterLab extension in a real browser (issues 7 and 23.5).

Starts a CPU KCoral server and JupyterLab with the server extension and the committed
prebuilt lab extension, then drives headless Chromium (Debian's ``chromium`` through the
``playwright-core`` npm package of ``labextension/``; nothing downloads a browser) with
``lab_browser.cjs``: the status bar shows the server, a ``%%kcoral`` cell's job appears in
the panel with live output, and Cancel stops a second, long-running job; with
``lab_sessions.cjs``: the panel lists a server's sessions and their seats, and Stop ends
the running one (the server's record says ``deleted``), while a rogue server's markup stays
text; with ``lab_run_all.cjs``: Run All on the README's quickstart in a fresh JupyterLab
shows no error outside the cell that fails on purpose. The panel is measured at
JupyterLab's default side-bar width: nothing in it may overflow. Screenshots go to
the test's temporary folder; to refresh the README's pictures run
``KCORAL_SCREENSHOT_DIR=docs/screenshots python -m pytest tests/labextension/test_browser.py``
(a test never writes into tracked files on its own).
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from stand_in_http import StandIn, serving
from waiting import wait_for

import kcoral

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
PLAYWRIGHT = ROOT / "labextension" / "node_modules" / "playwright-core"
BUILT = ROOT / "jupyter_ext" / "labextension"
SCRIPT = Path(__file__).with_name("lab_browser.cjs")
SESSIONS_SCRIPT = Path(__file__).with_name("lab_sessions.cjs")
RUN_ALL_SCRIPT = Path(__file__).with_name("lab_run_all.cjs")
REOPENED_SCRIPT = Path(__file__).with_name("lab_reopened.cjs")
SCREENSHOT_DIR_ENV = "KCORAL_SCREENSHOT_DIR"  # set it to refresh docs/screenshots/
LAB_TOKEN = "kcoral-browser-test"
KCORAL_TOKEN = "kcoral-browser-test-server-token"


def _missing() -> str | None:
    if not CHROMIUM.exists():
        return "needs /usr/bin/chromium (apt-get install -y chromium)"
    if shutil.which("node") is None:
        return "needs node on PATH"
    if not PLAYWRIGHT.is_dir():
        return "needs playwright-core: run `npm ci` in labextension/"
    if importlib.util.find_spec("jupyterlab") is None:
        return "needs the jupyterlab Python package (pip install 'kcoral[jupyter]')"
    if not (BUILT / "package.json").exists():
        return "needs the built extension: run `npm run build` in labextension/"
    return None


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_missing() is not None, reason=str(_missing())),
]

NOTEBOOK_CELLS = [
    "%load_ext kcoral",
    # A progress line rewritten with \r and coloured: the panel shows it as the cell does.
    "%%kcoral\nimport time\nprint('\\rwarming up  50%', end='', flush=True)\ntime.sleep(0.3)\n"
    "print('\\r\\x1b[32mwarming up done\\x1b[0m', flush=True)\nfor i in range(10):\n"
    "    print(f'tick {i}', flush=True)\n    time.sleep(0.5)",
    # A digest longer than the panel is wide, with nowhere to break: it wraps, as in the cell.
    "%%kcoral\nimport time\nprint('checkpoint sha256 ' + '0123456789abcdef' * 6)\n"
    "print('long job started', flush=True)\ntime.sleep(120)",
]
# After the cells above: `%kcoral connect URL` (cell 3), then one cell on that server.
SECOND_SERVER_CELL = "%%kcoral\nprint('on the second server')"
# Cell 5: still running on that server when the kernel restarts.
RESTART_CELL = "%%kcoral\nimport time\nprint('waiting for a restart', flush=True)\ntime.sleep(60)"


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _write_notebook(path: Path, connect_url: str) -> None:
    sources = [*NOTEBOOK_CELLS, f"%kcoral connect {connect_url}", SECOND_SERVER_CELL, RESTART_CELL]
    cells = [
        {
            "cell_type": "code",
            "metadata": {},
            "source": source,
            "outputs": [],
            "execution_count": None,
        }
        for source in sources
    ]
    document = {
        "cells": cells,
        "metadata": {
            "kernelspec": {"name": "python3", "display_name": "Python 3", "language": "python"}
        },
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    path.write_text(json.dumps(document), encoding="utf-8")


@contextlib.contextmanager
def _running_lab(
    tmp_path: Path, root: Path, kcoral_servers: list[dict] | None, *, server_extension: bool = True
) -> Iterator[str]:
    """JupyterLab on loopback with only this test's extension paths and settings (the
    committed build is what loads) and ``c.KCoralExtension.servers`` when given; its URL.
    ``server_extension=False``: without the kcoral_jupyter server extension."""
    jpath = tmp_path / "jupyter-path"
    (jpath / "labextensions").mkdir(parents=True)
    (jpath / "labextensions" / "kcoral-jupyterlab").symlink_to(BUILT)
    config = tmp_path / "config"
    config.mkdir()
    enabled = {"kcoral_jupyter": server_extension}
    server_config: dict = {"ServerApp": {"jpserver_extensions": enabled}}
    if kcoral_servers is not None:
        server_config["KCoralExtension"] = {"servers": kcoral_servers}
    (config / "jupyter_server_config.json").write_text(json.dumps(server_config))
    settings = tmp_path / "settings" / "kcoral-jupyterlab"
    settings.mkdir(parents=True)
    (settings / "plugin.jupyterlab-settings").write_text(json.dumps({"pollInterval": 1}))
    news = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    port = _free_port()
    env = dict(
        os.environ,
        JUPYTER_PATH=str(jpath),
        JUPYTER_CONFIG_DIR=str(config),
        JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"),
        JUPYTERLAB_SETTINGS_DIR=str(tmp_path / "settings"),
        JUPYTERLAB_WORKSPACES_DIR=str(tmp_path / "workspaces"),
    )
    env.pop("KCORAL_TOKEN", None)
    env.pop("KCORAL_URL", None)
    log = tmp_path / "lab.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [
                sys.executable, "-m", "jupyter", "lab", "--no-browser",
                "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={port}",
                f"--IdentityProvider.token={LAB_TOKEN}", f"--ServerApp.root_dir={root}",
                "--LabApp.expose_app_in_browser=True", "--allow-root",
            ],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{url}api/status?token={LAB_TOKEN}", timeout=2):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("JupyterLab did not start:\n" + log.read_text()[-4000:])
                time.sleep(0.25)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def _screenshot_dir(tmp_path: Path) -> Path:
    chosen = os.environ.get(SCREENSHOT_DIR_ENV)
    screenshots = Path(chosen).resolve() if chosen else tmp_path / "screenshots"
    screenshots.mkdir(parents=True, exist_ok=True)
    return screenshots


def _run_script(script: Path, url: str, tmp_path: Path, **extra_env: str) -> dict:
    """Run one browser script; what it saw (it must report ``ok``)."""
    env = dict(
        os.environ,
        LAB_URL=url,
        LAB_TOKEN=LAB_TOKEN,
        PLAYWRIGHT_CORE=str(PLAYWRIGHT),
        SCREENSHOT_DIR=str(_screenshot_dir(tmp_path)),
        **extra_env,
    )
    done = subprocess.run(
        ["node", str(script)], capture_output=True, text=True, env=env, timeout=360
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no report from the browser script:\n{done.stdout}\n{done.stderr}"
    seen = json.loads(lines[-1])
    lab_log = (tmp_path / "lab.log").read_text(errors="replace")[-3000:]
    assert seen.get("ok"), f"{json.dumps(seen, indent=1)}\n--- lab log ---\n{lab_log}"
    return seen


@pytest.fixture
def jupyter_lab(tmp_path: Path, server_factory) -> Iterator[tuple[str, str, Path]]:
    """JupyterLab on loopback as after a fresh install (no KCoral server configured: the
    first cell starts the kernel's embedded server), plus a CPU KCoral server with two
    workers that the notebook's cell 3 connects to: (url, token, tmp_path, that server's
    URL)."""
    kcoral = server_factory("--num-workers", "2")
    root = tmp_path / "root"
    root.mkdir()
    _write_notebook(root / "kcoral.ipynb", kcoral.url)
    with _running_lab(tmp_path, root, None) as url:
        yield url, LAB_TOKEN, tmp_path, kcoral.url


@pytest.mark.timeout(420)
def test_the_status_bar_panel_live_output_and_cancel_work_in_jupyterlab(jupyter_lab) -> None:
    url, _, tmp_path, connect_url = jupyter_lab
    seen = _run_script(SCRIPT, url, tmp_path, NOTEBOOK="kcoral.ipynb")
    screenshots = _screenshot_dir(tmp_path)
    assert seen["statusBeforeFirstCell"] == "KCoral ○ no server yet (starts with the first cell)"
    assert seen["statusVisibleBefore"] == seen["statusBeforeFirstCell"]
    assert seen["statusText"].startswith("KCoral ● cpu · ")  # the kernel's embedded server
    assert seen["statusVisibleText"] == seen["statusText"]
    assert "/2 busy" in seen["statusAfterConnect"]  # the server it connected to
    assert seen["panelOpenedByClick"]
    assert "tick 0" in seen["firstOutput"] and "tick 9" in seen["firstOutput"]
    # One line for the rewritten progress line, with no escape shown (it read `warming up
    # 50%[32mwarming up done[0m`)
    assert seen["firstOutput"].startswith("warming up done\ntick 0\n"), seen["firstOutput"]
    assert seen["firstOutput"].index("tick 0") < seen["firstOutput"].index("tick 9")
    assert seen["firstJobFinalStatus"] == "COMPLETED"
    assert seen["cancelEnabled"] and not seen["cancelEnabledAfter"]
    # The pane names a running cell's step as its status line does (not `instruction 2
    # run cell`, the program's op and id).
    assert seen["secondJobPhase"] == "running", seen["secondJobPhase"]
    # The long digest wraps in the pane: it ran past the pane's right edge, to be scrolled to.
    assert seen["secondOutputFit"]["scrollWidth"] <= seen["secondOutputFit"]["clientWidth"], seen
    assert seen["secondJobFinalStatus"] == "CANCELLED"
    assert [c[:2] for c in seen["commands"]] == [
        ["kcoral:show-panel", True],
        ["kcoral:cancel-job", True],
    ]
    assert (screenshots / "statusbar.png").exists() and (screenshots / "panel.png").exists()
    assert seen["firstJobCells"][0] == "done"  # a word, not COMPLETED

    # Issue 29.4: at JupyterLab's default side-bar width nothing in the panel overflows,
    # with one server's jobs and with two servers' jobs under their servers' names.
    for fit in (seen["fitOneServer"], seen["fitTwoServers"]):
        assert fit["tableScrollWidth"] <= fit["panelClientWidth"], fit
        assert fit["panelScrollWidth"] <= fit["panelClientWidth"], fit
        assert fit["overflowing"] == [], fit
        assert fit["cut"] == [], fit  # no header, status or time cut short
    # Each server has a name a person recognises: the notebook's embedded server by its
    # notebook, the connected one by its URL (not local-31932 / kernel-f76ef9e1).
    embedded = seen["embeddedServer"]
    assert embedded["label"] == "local server of kcoral.ipynb", embedded
    assert ["used by", "kcoral.ipynb"] in embedded["facts"]
    host_port = connect_url.removeprefix("http://")
    labels = dict(seen["serverLabels"])
    assert sorted(labels.values()) == sorted(["local server of kcoral.ipynb", host_port])
    assert seen["jobServerHeadings"] == [host_port, "local server of kcoral.ipynb"]
    # A cell running when its kernel restarted said `kcoral: running` for good: nothing
    # would update it again. It says the kernel restarted, and how to ask after its job.
    restarted = seen["lineAfterRestart"]
    assert "kcoral: running" not in restarted, restarted
    # its last words say how long it had run ("running 3 s"), and its job once, in full (the
    # live line's own "· job f2951d98" named it a second time)
    assert re.search(
        r"kcoral: \u26a0 the kernel restarted while this cell ran "
        r"\(last: running[0-9 mins]*\); "
        rf"job ([0-9a-f-]{{36}}) may still run on {re.escape(connect_url)} "
        r"\(%kcoral attach \1 there\)",
        restarted,
    ), restarted


# What a rogue KCoral server says about its one session: markup in every text field, to
# show that the panel writes them as text (a script in them would set window.__kcoralPwned).
ROGUE_SESSION_ID = '"><img src=x onerror="window.__kcoralPwned=1">'
ROGUE_OWNER = '<img src=x onerror="window.__kcoralPwned=2">'


class _RogueServer(StandIn):
    """A server that answers the panel's polls with markup where text belongs, and a
    ``/health`` without its load counts."""

    def do_GET(self) -> None:
        record = {
            "session_id": ROGUE_SESSION_ID,
            "owner": ROGUE_OWNER,
            "state": "IDLE",
            "gpu_ids": ["<b>"],
            "end_message": "<script>window.__kcoralPwned=3</script>",
            "memory_bytes": "<i>lots</i>",
        }
        answers = {
            "/health": {
                "status": "ok",
                "instance_id": "rogue",
                "started_at": "2026-01-05T09:30:00Z",
                "gpu_count": 0,
                "load": "<b>busy</b>",  # not the object PROTOCOL §12 says
                "target": {},
                "versions": {},
            },
            "/v1/info": {"kcoral": "<b>9</b>", "protocol": 1, "features": ["sessions"]},
            "/v1/sessions": [record],
        }
        not_found = {"error": {"kind": "not_found"}}
        self.send_json(answers.get(self.path, not_found), 200 if self.path in answers else 404)


def _sleeping_program(seconds: int) -> kcoral.Program:
    program = kcoral.Program()
    module = program.upload(
        kind="module", source=f"import time\ndef f():\n    time.sleep({seconds})\n"
    )
    program.return_(key="x", value=program.run(fn=program.get_function(module=module, name="f")))
    return program


def _record(client: kcoral.Client, session_id: str) -> dict:
    return json.loads(bytes(client.request("GET", f"/v1/sessions/{session_id}").data))


@pytest.mark.timeout(420)
def test_the_panel_lists_sessions_and_stop_ends_one(tmp_path: Path, server_factory) -> None:
    kcoral_server = server_factory("--max-sessions", "2", env={"KCORAL_AUTH_TOKEN": KCORAL_TOKEN})
    client = kcoral.Client(kcoral_server.url, token=KCORAL_TOKEN)
    with client.session() as idle, client.session() as busy:
        idle.execute(_sleeping_program(0))  # one program run: the idle clock restarted
        job = busy.submit(_sleeping_program(300))
        root = tmp_path / "root"
        root.mkdir()
        with serving(_RogueServer) as rogue_url:
            servers = [
                {"name": "cpu", "url": kcoral_server.url, "token": KCORAL_TOKEN},
                {"name": "rogue", "url": rogue_url},
            ]
            with _running_lab(tmp_path, root, servers) as url:
                seen = _run_script(
                    SESSIONS_SCRIPT,
                    url,
                    tmp_path,
                    IDLE_SESSION=idle.id,
                    RUNNING_SESSION=busy.id,
                    ROGUE_SESSION=ROGUE_SESSION_ID,
                )
        assert seen["sessionsVisible"]
        assert seen["order"][:2] == [busy.id, idle.id]  # the newest first, the rogue's last
        # The rogue server's markup is shown as text and runs nothing.
        assert seen["pwned"] is None
        assert seen["rogue"]["owner"] == ROGUE_OWNER
        assert seen["rogue"]["id"] == ROGUE_SESSION_ID[:8]
        assert seen["rogue"]["gpu"] == "CPU" and seen["rogue"]["memory"] == "mem –"
        assert seen["rogueServer"]["state"] == "offline"
        # At the default side-bar width the session cards fit too (issue 29.4).
        assert seen["fitNarrow"]["panelScrollWidth"] <= seen["fitNarrow"]["panelClientWidth"]
        assert seen["fitNarrow"]["overflowing"] == [], seen["fitNarrow"]
        assert "without its load counts" in seen["rogueServer"]["text"]
        # "mem –" until the server reports the worker's memory (memory_bytes)
        memory = re.compile(r"mem (–|\d+(\.\d)? (B|KiB|MiB|GiB))")
        for card, session in ((seen["idle"], idle), (seen["running"], busy)):
            assert card["id"] == session.id[:8]
            assert card["owner"] == "default" and card["gpu"] == "CPU"
            assert memory.fullmatch(card["memory"]), card["memory"]
            assert session.id in card["title"] and " on cpu" in card["title"]
            assert card["server"] == "on cpu"  # two servers have sessions: each card says which
            assert card["stop"] == {"text": "Stop", "enabled": True}
        assert seen["running"]["stateText"] == "running a program"
        assert re.fullmatch(r"idle \d+ (s|min) · ends in \d+ min", seen["idle"]["stateText"])
        assert seen["seats"].startswith("2/2 seats held · ")

        assert seen["stopped"]["state"] == "ENDED"
        assert seen["stopped"]["stateText"] == "stopped"  # not "ended: deleted"
        assert seen["stopped"]["stop"] is None and seen["stopped"]["memory"] is None
        assert seen["note"] == f"session {busy.id[:8]} ended"
        assert seen["idleAfter"]["state"] == "IDLE"
        assert seen["seatsAfter"].startswith("1/2 seats held")
        stopped = _record(client, busy.id)
        assert (stopped["state"], stopped["end_reason"]) == ("ENDED", "deleted")
        assert _record(client, idle.id)["state"] == "IDLE"
        with pytest.raises(kcoral.KCoralError):
            job.result()
    screenshots = _screenshot_dir(tmp_path)
    assert (screenshots / "sessions.png").exists()


QUICKSTART = ROOT / "notebooks" / "quickstart.ipynb"
FAILS_ON_PURPOSE = "raises-exception"  # nbformat's tag for a cell that is meant to raise


def _error_outputs(cell: dict) -> list[str]:
    """A cell's error outputs (tracebacks), as text."""
    return [
        f"{output.get('ename')}: {output.get('evalue')}"
        for output in cell.get("outputs", [])
        if output.get("output_type") == "error"
    ]


@pytest.mark.timeout(420)
def test_run_all_on_the_quickstart_in_a_fresh_jupyterlab_shows_no_error_but_the_deliberate_one(
    tmp_path: Path,
) -> None:
    # Issue 29.1: what a person does first. A fresh JupyterLab (no KCoral server configured,
    # no KCORAL_URL: the notebook starts its kernel's embedded server), the README's
    # quickstart, Run All; every code cell runs, and only the cell tagged raises-exception
    # shows an error.
    root = tmp_path / "root"
    root.mkdir()
    shutil.copy(QUICKSTART, root / "quickstart.ipynb")
    with _running_lab(tmp_path, root, None) as url:
        seen = _run_script(RUN_ALL_SCRIPT, url, tmp_path, NOTEBOOK="quickstart.ipynb")
    code = [cell for cell in seen["cells"] if cell["cell_type"] == "code"]
    not_run = [i for i, c in enumerate(seen["cells"]) if c in code and c["execution_count"] is None]
    unexpected = {
        index: _error_outputs(cell)
        for index, cell in enumerate(seen["cells"])
        if cell["cell_type"] == "code"
        and FAILS_ON_PURPOSE not in cell.get("metadata", {}).get("tags", [])
        and _error_outputs(cell)
    }
    assert unexpected == {}, unexpected
    assert code and not_run == [], f"Run All stopped before cells {not_run}"
    deliberate = [c for c in code if FAILS_ON_PURPOSE in c.get("metadata", {}).get("tags", [])]
    assert deliberate and all(_error_outputs(cell) for cell in deliberate)


@pytest.mark.timeout(420)
def test_a_notebook_saved_while_a_cell_ran_opens_with_its_line_settled(tmp_path: Path) -> None:
    # A notebook saved (or a page reloaded) while a %%kcoral cell ran kept `kcoral: running`
    # for good: the kernel's updates reach only the view that ran the cell.
    job_id = "c84f8fc6-1d2e-4f00-8a00-000000000001"
    line = "kcoral: running \u00b7 job c84f8fc6 \u00b7 0:12"
    live = {
        "output_type": "display_data",
        "data": {"text/plain": line, "text/html": f"<div>{line}</div>"},
        "metadata": {"kcoral": {"live": True, "job_id": job_id, "server": "http://gpu:8000"}},
    }
    cell = {"cell_type": "code", "metadata": {}, "source": "%%kcoral\nwork()", "outputs": [live]}
    document = {
        "cells": [{**cell, "execution_count": 1}],
        "metadata": {"kernelspec": {"name": "python3", "display_name": "Python 3"}},
        "nbformat": 4,
        "nbformat_minor": 5,
    }
    root = tmp_path / "root"
    root.mkdir()
    (root / "saved.ipynb").write_text(json.dumps(document), encoding="utf-8")
    # A configured server that nothing answers at: the panel's jobs note says it listed
    # none (its jobs are unknown), not "No jobs yet."
    gone = f"127.0.0.1:{_free_port()}"
    servers = [{"name": "gone", "url": f"http://{gone}"}]
    with _running_lab(tmp_path, root, servers) as url:
        seen = _run_script(REOPENED_SCRIPT, url, tmp_path, NOTEBOOK="saved.ipynb")
    assert seen["jobsNote"] == f"No jobs listed. gone: not running: nothing answers at {gone}"
    expected = (
        "kcoral: \u26a0 the notebook was reopened while this cell ran (last: running \u00b7 "
        f"0:12); job {job_id} may still run on http://gpu:8000 (%kcoral attach {job_id} there)"
    )
    assert [o["data"]["text/plain"] for o in seen["outputs"]] == [expected]
    assert seen["outputs"][0]["metadata"]["kcoral"]["live"] is False
    assert seen["shownText"].strip() == expected


STATUS_SCRIPT = Path(__file__).with_name("lab_status.cjs")


@pytest.mark.timeout(420)
def test_a_server_that_refuses_the_configured_token_is_not_shown_as_ready(
    tmp_path: Path, server_factory
) -> None:
    # A soak: KCORAL_URL with a wrong KCORAL_TOKEN. /health answers anyone (PROTOCOL §12),
    # so the status bar showed a green `KCoral ● cpu · 0/1 busy · 0 queued`, and the panel
    # a green dot, while the server refused every cell, job and session from here.
    kcoral_server = server_factory(env={"KCORAL_AUTH_TOKEN": KCORAL_TOKEN})
    root = tmp_path / "root"
    root.mkdir()
    servers = [{"name": "gpu", "url": kcoral_server.url, "token": "not-" + KCORAL_TOKEN}]
    with _running_lab(tmp_path, root, servers) as url:
        seen = _run_script(
            STATUS_SCRIPT, url, tmp_path, STATUS_PATTERN="refused", SHOT="token-refused.png"
        )
    assert seen["status"] == "KCoral \u25cf cpu \u00b7 token refused", seen
    assert seen["statusTitle"] == (
        "KCoral server gpu: refused the token configured for it (HTTP 401). "
        "Click to open the KCoral panel."
    )
    assert seen["cardError"] == "refused the token configured for it (HTTP 401)"
    assert seen["statusState"] == seen["cardState"] == "refused"
    # Neither dot is the green of a server that takes cells.
    assert seen["statusDot"] == seen["cardDot"] != "rgb(56, 142, 60)", seen
    # The status text sits on JupyterLab's own status text line (it sat 4 px higher).
    assert seen["statusTextBox"] == seen["labTextBox"], seen


@pytest.mark.timeout(420)
def test_without_the_server_extension_the_status_bar_says_so(tmp_path: Path) -> None:
    # A soak: a JupyterLab whose kcoral_jupyter server extension is not enabled (the lab
    # extension loads, its routes answer 404) said `KCoral \u25cf offline` and `The KCoral
    # server extension cannot be reached.`, which waiting never mends.
    root = tmp_path / "root"
    root.mkdir()
    with _running_lab(tmp_path, root, None, server_extension=False) as url:
        seen = _run_script(
            STATUS_SCRIPT, url, tmp_path, STATUS_PATTERN="not enabled", SHOT="no-extension.png"
        )
    assert seen["status"] == "KCoral \u25cf server extension not enabled", seen
    enable = (
        "The KCoral server extension is not enabled in this Jupyter server: install "
        "kcoral[jupyter] where jupyter lab runs and restart it (or run: jupyter server "
        "extension enable kcoral_jupyter)."
    )
    assert seen["statusTitle"] == enable + " Click to open the KCoral panel."
    assert seen["notes"] == [enable, "No jobs listed."], seen


FLEET_SCRIPT = Path(__file__).with_name("lab_fleet.cjs")
OTHER_KIND = {"gpu": "h100", "arch": "sm_90a", "memory_bytes": 80 << 30, "gpus": 1}
HOLD_SOURCE = (
    "import os, time\n\n"
    "def main(path):\n"
    "    while not os.path.exists(path):\n"
    "        time.sleep(0.02)\n"
    "    return 1\n"
)


@pytest.mark.timeout(420)
def test_the_panel_shows_a_routers_fleet_with_true_short_numbers(tmp_path: Path) -> None:
    # Issue 33.3: a router behind the panel: its kinds and labels with nodes, free seats,
    # queue and estimated wait, while a program holds the default kind's only seat and
    # another waits at the router.
    sys.path.insert(0, str(ROOT / "tests" / "router"))
    from kcoral_server.node import supervisor as supervisor_module
    from raw_http import call_program, post_execute, request
    from router_helpers import Node, start_router, stopping

    router = start_router(tmp_path, "--status-check-interval-seconds", "0.3")
    nodes = [Node(tmp_path, router, "cpu-a", None, "--node-label", "pool=small")]
    release = tmp_path / "release"
    with stopping(router, nodes):

        def default_kind() -> dict:
            answer = request(router.url, "GET", "/v1/info")
            kinds = answer.body.get("fleet_status", {}).get("kinds") if answer.status == 200 else 0
            return kinds[0] if kinds else {}

        # cpu-a first: the default kind
        wait_for(lambda: default_kind().get("seats") == 1, "cpu-a ready", 90.0, detail=router.log)
        other = {supervisor_module.NODE_KIND_OVERRIDE_ENV: json.dumps(OTHER_KIND)}
        nodes.append(Node(tmp_path, router, "h100-a", other, "--node-label", "pool=big"))
        wait_for(
            lambda: len(request(router.url, "GET", "/v1/info").body["fleet"]["kinds"]) == 2,
            "both kinds listed",
            90.0,
            detail=router.log,
        )
        assert post_execute(router.url, call_program("def main():\n    return 1\n")).status == 200
        hold = call_program(HOLD_SOURCE, args=[str(release)])
        holding = [threading.Thread(target=post_execute, args=(router.url, hold)) for _ in "ab"]
        holding[0].start()  # holds the only seat
        wait_for(
            lambda: default_kind().get("free_seats") == 0, "the seat held", 90.0, detail=router.log
        )
        holding[1].start()  # waits at the router
        root = tmp_path / "root"
        root.mkdir()
        try:
            with _running_lab(tmp_path, root, [{"name": "fleet", "url": router.url}]) as url:
                seen = _run_script(FLEET_SCRIPT, url, tmp_path)
        finally:
            release.write_text("go")
            for thread in holding:
                thread.join(120)
    fleet = seen["fleet"]
    assert fleet["header"] == ["fleet", "nodes", "free", "queue", "wait"]
    rows = {row["cells"][0]: row for row in fleet["rows"]}
    assert list(rows) == ["gpu=cpu", "gpu=h100 ×1", "pool=big", "pool=small"]
    cpu = rows["gpu=cpu"]
    assert cpu["cells"][1:4] == ["1", "0/1", "1"] and cpu["bold"]
    # (queued 1 + 1) / 1 seat × a few ms of recent seat time: under a second, said so
    assert re.fullmatch(r"<1 s|\d+ s", cpu["cells"][4]), cpu
    assert "the default kind" in cpu["title"]
    assert rows["gpu=h100 ×1"]["cells"][1:] == ["1", "1/1", "0", "–"]
    assert not rows["gpu=h100 ×1"]["bold"] and "sm_90a" in rows["gpu=h100 ×1"]["title"]
    assert rows["pool=small"]["cells"][1:4] == ["1", "0/1", "1"]
    assert rows["pool=big"]["cells"][1:] == ["1", "1/1", "0", "–"]
    assert fleet["cut"] == []  # no number cut short
    fit = seen["fitNarrow"]
    assert fit["panelScrollWidth"] <= fit["panelClientWidth"], fit
    assert fit["overflowing"] == [], fit
    assert (_screenshot_dir(tmp_path) / "fleet-narrow.png").exists()
