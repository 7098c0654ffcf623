"""A web page the user visits attacks the KCoral routes of the user's JupyterLab, for real:
the user is logged in to JupyterLab in headless Chromium (the browser holds Jupyter's login
cookie), and ``web_page_attack_on_jupyter.html`` opens in another tab (driven by
``web_page_attacks_on_jupyter.cjs``), from another site (``http://evil.example:PORT``) and
from another port of the same host (same-site: the browser sends the login cookie along).

Its attacks: CORS reads of the server list and the job list, a ``DELETE`` of the user's job
(it needs a preflight), a ``no-cors`` ``POST``, an ``EventSource`` with credentials on the
job's live output, the job list loaded as a ``<script>``, the live output as an ``<img>``,
the server list in an ``<iframe>``. The KCoral server behind the extension records every
call: none may reach it, and the page reads nothing. Before the extension checked
``Sec-Fetch-Site`` (``base_handler``), the same-site page's ``<script>`` and ``<img>``
(no ``Origin``, the login cookie) ran the routes with the user's KCoral tokens.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from stand_in_http import StandIn, serving

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "labextension"))
from test_browser import LAB_TOKEN, PLAYWRIGHT, _missing, _running_lab

HERE = Path(__file__).resolve().parent
PAGE = HERE / "web_page_attack_on_jupyter.html"
SCRIPT = HERE / "web_page_attacks_on_jupyter.cjs"
JOB = "job-of-the-user"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_missing() is not None, reason=str(_missing())),
]


class UsersKCoralServer(StandIn):
    """The user's KCoral server behind the extension: records every call, answers each as a
    server without that job would."""

    calls: ClassVar[list[str]] = []
    lock = threading.Lock()

    def _answer(self) -> None:
        with self.lock:
            self.calls.append(f"{self.command} {self.path}")
        self.send_json({"error": {"kind": "not_found", "message": "no such job"}}, 404)

    do_GET = do_DELETE = do_POST = _answer


class AttackerSite(StandIn):
    """The attacker's web server: the attack page, whatever path is asked."""

    def do_GET(self) -> None:
        body = PAGE.read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", "text/html; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def lab_and_upstream(tmp_path: Path) -> Iterator[str]:
    """JupyterLab with the extension, its one KCoral server the recorder; the lab's URL."""
    root = tmp_path / "root"
    root.mkdir()
    with serving(UsersKCoralServer) as upstream:
        with _running_lab(tmp_path, root, [{"name": "mine", "url": upstream}]) as url:
            yield url


@pytest.mark.timeout(300)
def test_a_page_with_the_users_jupyter_cookie_reaches_no_kcoral_server(
    lab_and_upstream: str,
) -> None:
    lab = lab_and_upstream
    with serving(AttackerSite) as attacker:
        port = attacker.rsplit(":", 1)[1]
        pages = [
            f"http://{host}:{port}/attack.html?lab={lab}&job={JOB}"
            for host in ("evil.example", "127.0.0.1")
        ]
        UsersKCoralServer.calls.clear()
        environment = dict(
            os.environ,
            PLAYWRIGHT_CORE=str(PLAYWRIGHT),
            LAB_URL=lab,
            LAB_TOKEN=LAB_TOKEN,
            PAGE_URLS=" ".join(pages),
        )
        done = subprocess.run(
            ["node", str(SCRIPT)], capture_output=True, text=True, env=environment, timeout=240
        )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no report from the browser:\n{done.stdout}\n{done.stderr}"
    seen = json.loads(lines[-1])
    assert "error" not in seen, seen["error"]
    assert any(name.startswith("username-") for name in seen["cookies"]), "never logged in"
    for host, page in seen["pages"].items():
        report = page["report"]
        for name in ("read_servers", "read_jobs", "cancel_job"):
            assert report[name] == "failed", (host, name, report[name])
        assert report["event_source"] == "error", (host, report)
        assert report["script_jobs"] == "error", (host, report)
        assert report["image_events"] == "error", (host, report)
        for frame in page["frames"]:  # refused: empty, or Chromium's error page
            assert not frame.startswith("http"), (host, "framed", frame)
    assert UsersKCoralServer.calls == [], "a page's request reached the user's KCoral server"
