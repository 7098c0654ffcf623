"""The JupyterLab extension in a real browser (issue 7).

Starts a CPU KCoral server and JupyterLab with the server extension and the committed
prebuilt lab extension, then drives headless Chromium (Debian's ``chromium`` through the
``playwright-core`` npm package of ``labextension/``; nothing downloads a browser) with
``lab_browser.cjs``: the status bar shows the server, a ``%%kcoral`` cell's job appears in
the panel with live output, and Cancel stops a second, long-running job. Screenshots go to
the test's temporary folder; to refresh the README's pictures run
``KCORAL_SCREENSHOT_DIR=docs/screenshots python -m pytest tests/labextension/test_browser.py``
(a test never writes into tracked files on its own).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
PLAYWRIGHT = ROOT / "labextension" / "node_modules" / "playwright-core"
BUILT = ROOT / "jupyter_ext" / "labextension"
SCRIPT = Path(__file__).with_name("lab_browser.cjs")
SCREENSHOT_DIR_ENV = "KCORAL_SCREENSHOT_DIR"  # set it to refresh docs/screenshots/


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
    "%%kcoral\nimport time\nfor i in range(10):\n"
    "    print(f'tick {i}', flush=True)\n    time.sleep(0.5)",
    "%%kcoral\nimport time\nprint('long job started', flush=True)\ntime.sleep(120)",
]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def _write_notebook(path: Path, connect_url: str) -> None:
    sources = [*NOTEBOOK_CELLS, f"%kcoral connect {connect_url}"]
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


@pytest.fixture
def jupyter_lab(tmp_path: Path, server_factory) -> Iterator[tuple[str, str, Path]]:
    """JupyterLab on loopback as after a fresh install (no KCoral server configured: the
    first cell starts the kernel's embedded server), plus a CPU KCoral server with two
    workers that the notebook's last cell connects to: (url, token, root)."""
    kcoral = server_factory("--num-workers", "2")
    root = tmp_path / "root"
    root.mkdir()
    _write_notebook(root / "kcoral.ipynb", kcoral.url)
    # Only this test's extension paths and settings: the committed build is what loads.
    jpath = tmp_path / "jupyter-path"
    (jpath / "labextensions").mkdir(parents=True)
    (jpath / "labextensions" / "kcoral-jupyterlab").symlink_to(BUILT)
    config = tmp_path / "config"
    config.mkdir()
    (config / "jupyter_server_config.json").write_text(
        json.dumps({"ServerApp": {"jpserver_extensions": {"kcoral_jupyter": True}}})
    )
    settings = tmp_path / "settings" / "kcoral-jupyterlab"
    settings.mkdir(parents=True)
    (settings / "plugin.jupyterlab-settings").write_text(json.dumps({"pollInterval": 1}))
    news = tmp_path / "settings" / "@jupyterlab" / "apputils-extension"
    news.mkdir(parents=True)
    (news / "notification.jupyterlab-settings").write_text(json.dumps({"fetchNews": "false"}))
    token = "kcoral-browser-test"
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
                f"--IdentityProvider.token={token}", f"--ServerApp.root_dir={root}",
                "--LabApp.expose_app_in_browser=True", "--allow-root",
            ],
            stdout=out, stderr=subprocess.STDOUT, env=env, cwd=root,
        )  # fmt: skip
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.monotonic() + 90
        while True:
            try:
                with urllib.request.urlopen(f"{url}api/status?token={token}", timeout=2):
                    break
            except OSError:
                if process.poll() is not None or time.monotonic() > deadline:
                    pytest.fail("JupyterLab did not start:\n" + log.read_text()[-4000:])
                time.sleep(0.25)
        yield url, token, tmp_path
    finally:
        process.terminate()
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


@pytest.mark.timeout(420)
def test_the_status_bar_panel_live_output_and_cancel_work_in_jupyterlab(jupyter_lab) -> None:
    url, token, tmp_path = jupyter_lab
    chosen = os.environ.get(SCREENSHOT_DIR_ENV)
    screenshots = Path(chosen).resolve() if chosen else tmp_path / "screenshots"
    screenshots.mkdir(parents=True, exist_ok=True)
    env = dict(
        os.environ,
        LAB_URL=url,
        LAB_TOKEN=token,
        PLAYWRIGHT_CORE=str(PLAYWRIGHT),
        SCREENSHOT_DIR=str(screenshots),
        NOTEBOOK="kcoral.ipynb",
    )
    done = subprocess.run(
        ["node", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=360
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no report from the browser script:\n{done.stdout}\n{done.stderr}"
    seen = json.loads(lines[-1])
    lab_log = (tmp_path / "lab.log").read_text(errors="replace")[-3000:]
    assert seen.get("ok"), f"{json.dumps(seen, indent=1)}\n--- lab log ---\n{lab_log}"
    assert seen["statusBeforeFirstCell"] == "KCoral ○ no server yet (starts with the first cell)"
    assert seen["statusVisibleBefore"] == seen["statusBeforeFirstCell"]
    assert seen["statusText"].startswith("KCoral ● cpu · ")  # the kernel's embedded server
    assert seen["statusVisibleText"] == seen["statusText"]
    assert "/2 busy" in seen["statusAfterConnect"]  # the server it connected to
    assert seen["panelOpenedByClick"]
    assert "tick 0" in seen["firstOutput"] and "tick 9" in seen["firstOutput"]
    assert seen["firstOutput"].index("tick 0") < seen["firstOutput"].index("tick 9")
    assert seen["firstJobFinalStatus"] == "COMPLETED"
    assert seen["cancelEnabled"] and not seen["cancelEnabledAfter"]
    assert seen["secondJobFinalStatus"] == "CANCELLED"
    assert [c[:2] for c in seen["commands"]] == [
        ["kcoral:show-panel", True],
        ["kcoral:cancel-job", True],
    ]
    assert (screenshots / "statusbar.png").exists() and (screenshots / "panel.png").exists()
