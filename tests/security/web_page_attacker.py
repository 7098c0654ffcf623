"""What the real-browser attacks (``test_web_page_attacks_*``) share: the attacker's web
server, which serves the attack pages of this folder and the script they share, by name,
and the run of one browser script."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from stand_in_http import StandIn

HERE = Path(__file__).resolve().parent
#: what the attacker's site serves: the pages and the helpers they load
SERVED = ("web_page_attack.html", "web_page_attack_on_jupyter.html", "web_page_attack_helpers.js")


class AttackerSite(StandIn):
    """``GET /NAME`` of one of ``SERVED`` (the query ignored); anything else is 404."""

    def do_GET(self) -> None:
        name = self.path.split("?", 1)[0].lstrip("/")
        if name not in SERVED:
            self.send_json({"error": "not here"}, 404)
            return
        body = (HERE / name).read_bytes()
        kind = "text/html" if name.endswith(".html") else "text/javascript"
        self.send_response(200)
        self.send_header("Content-Type", f"{kind}; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def run_browser_script(script: Path, playwright: Path, **environment: str) -> dict:
    """What the browser script ``script`` (node, with ``environment``) reported: its JSON
    line, which must hold no ``error``."""
    done = subprocess.run(
        ["node", str(script)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PLAYWRIGHT_CORE=str(playwright), **environment),
        timeout=300,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert lines, f"no report from the browser:\n{done.stdout}\n{done.stderr}"
    seen = json.loads(lines[-1])
    assert "error" not in seen, seen["error"]
    return seen
