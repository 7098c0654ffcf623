"""A web page the user visits attacks the KCoral routes of the user's JupyterLab, for real:
the user is logged in to JupyterLab in headless Chromium (the browser holds Jupyter's login
cookie), and ``web_page_attack_on_jupyter.html`` opens in another tab (driven by
``web_page_attacks_on_jupyter.cjs``), from another site (``http://evil.example:PORT``) and
from another port of the same host (same-site: the browser sends the login cookie along).

Its attacks: CORS reads of the server list and the job list, a ``DELETE`` of the user's job
(it needs a preflight), a ``no-cors`` ``POST``, an ``EventSource`` with credentials on the
job's live output, the job list loaded as a ``<script>``, the live output as an ``<img>``,
the server list in an ``<iframe>``. The KCoral server behind the extension records every
call (``stand_in_kcoral.RecordingKCoralServer``): none may reach it, and the page reads
nothing. Before the extension checked
``Sec-Fetch-Site`` (``base_handler``), the same-site page's ``<script>`` and ``<img>``
(no ``Origin``, the login cookie) ran the routes with the user's KCoral tokens.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from stand_in_http import serving
from web_page_attacker import AttackerSite, run_browser_script

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "labextension"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "jupyter" / "serverext"))
from stand_in_kcoral import RecordingKCoralServer
from test_browser import LAB_TOKEN, PLAYWRIGHT, _missing, _running_lab

SCRIPT = Path(__file__).resolve().with_name("web_page_attacks_on_jupyter.cjs")
JOB = "job-of-the-user"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_missing() is not None, reason=str(_missing())),
]


@pytest.fixture
def lab_and_upstream(tmp_path: Path) -> Iterator[str]:
    """JupyterLab with the extension, its one KCoral server the recorder; the lab's URL."""
    root = tmp_path / "root"
    root.mkdir()
    with serving(RecordingKCoralServer) as upstream:
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
            f"http://{host}:{port}/web_page_attack_on_jupyter.html?lab={lab}&job={JOB}"
            for host in ("evil.example", "127.0.0.1")
        ]
        RecordingKCoralServer.calls.clear()
        seen = run_browser_script(
            SCRIPT, PLAYWRIGHT, LAB_URL=lab, LAB_TOKEN=LAB_TOKEN, PAGE_URLS=" ".join(pages)
        )
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
    assert RecordingKCoralServer.calls == [], "a page's request reached the user's KCoral server"
