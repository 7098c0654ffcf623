"""A web page the user visits attacks the user's ``kcoral server`` and ``kcoral router`` on
loopback, for real: Debian's headless Chromium opens ``web_page_attack.html`` (driven by
``web_page_attacks.cjs``), which makes every request a page can make of them and records
what it saw.

Attacker: a *web page*: another site's (``http://evil.example:PORT``, resolved to
127.0.0.1 by Chromium's resolver rules), a page on another port of the same host (a local
program's page, "same-site"), and a DNS-rebinding page (its own name rebound to 127.0.0.1,
served under the target's port: the target is its own origin). Its attacks: a
``multipart`` and a ``text/plain`` ``no-cors`` POST of a program, a beacon, a form post, a
``POST`` from a sandboxed iframe (``Origin: null``), CORS reads of ``/v1/info``,
``/v1/jobs`` and ``/health``, a WebSocket, an ``EventSource`` on a real job's live
output, the job list loaded as a ``<script>``, ``/health`` as an image, ``/v1/info`` in an
``<iframe>``, a 128 MiB body. None may run the program (it would write a marker), read an
answer, load an answer as a script, show one inside the page, or grow the server's memory
by the body (it is refused on its head, never read). The user still opens ``/v1/info`` by
typing its address or following a link (EXTENSIONS §6, "Browsers").

Before fetch metadata was checked, the job list loaded and ran as the page's script, and
any answer showed in the page's frame (Chromium sends neither ``Origin`` nor a foreign
``Host`` with those ``GET``s).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from stand_in_http import serving
from web_page_attacker import AttackerSite, run_browser_script

import kcoral

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "labextension"))
from router_helpers import start_router
from test_browser import PLAYWRIGHT, _missing  # Chromium, node and playwright-core

SCRIPT = Path(__file__).resolve().with_name("web_page_attacks.cjs")


pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(_missing() is not None, reason=str(_missing())),
]


@pytest.fixture(scope="module")
def attacker_port() -> Iterator[int]:
    with serving(AttackerSite) as url:
        yield int(url.rsplit(":", 1)[1])


def visit(page_url: str, target: str, *, rebound: bool = False) -> dict:
    """What Chromium saw on the attack page at ``page_url`` aimed at ``target``."""
    rebinding = "1" if rebound else "0"
    return run_browser_script(
        SCRIPT, PLAYWRIGHT, PAGE_URL=page_url, TARGET=target, REBOUND=rebinding
    )


def page_query(target: str, marker: Path, job: str) -> str:
    return f"?target={target}&marker={marker}&job={job}"


def peak_memory_mib(pid: int) -> float:
    """The process's peak resident memory so far (``VmHWM``), in MiB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmHWM in /proc/{pid}/status")


def assert_nothing_reached(seen: dict, rebound: bool = False) -> None:
    """Nothing the page did ran, read, loaded or showed an answer."""
    report = seen["report"]
    for name in ("read_info", "read_jobs", "read_health"):
        # another site's page cannot read at all; a rebound page reads only the refusal
        allowed = ("read 403 ",) if rebound else ("failed",)
        assert report[name].startswith(allowed), (name, report[name])
        assert "forbidden" in report[name] or not rebound, (name, report[name])
    assert report["script_jobs"] == "error", "the job list loaded as the page's script"
    assert report["image_health"] == "error", report
    assert report["websocket"] == "error", report
    assert report["event_source"] == "error", "the page read the job's live output"
    for frame in seen["frames"]:
        assert frame["url"].startswith("chrome-error:"), f"the page framed an answer: {frame}"
    # and before any of that, the target refused every request the page made
    served = [answer for answer in seen["answers"] if answer["status"] != 403]
    assert seen["answers"] and not served, f"answered the page: {served}"


def test_another_sites_page_in_chromium_runs_nothing_reads_nothing_and_frames_nothing(
    kcoral_server, attacker_port: int, tmp_path: Path
) -> None:
    client = kcoral.Client(kcoral_server.url)
    program = kcoral.Program()
    program.return_(key="k", value=program.upload(kind="bytes", value=b"secret", id="k"))
    job = client.submit(program)
    marker = tmp_path / "ran"
    peak_before = peak_memory_mib(kcoral_server.process.pid)
    for page_host in ("evil.example", "127.0.0.1"):  # another site; another port (same-site)
        page = f"http://{page_host}:{attacker_port}/web_page_attack.html"
        seen = visit(page + page_query(kcoral_server.url, marker, job.id), kcoral_server.url)
        assert_nothing_reached(seen)
        assert not marker.exists(), f"the program of {page_host}'s page ran"
        # The user reaches the same address on their own: typed, or through the link.
        assert '"kcoral"' in seen["typed"], seen["typed"]
        assert '"kcoral"' in seen["followed"], seen["followed"]
    assert [listed["job_id"] for listed in client.jobs()] == [job.id], "the page submitted a job"
    grown = peak_memory_mib(kcoral_server.process.pid) - peak_before
    assert grown < 64, f"the server's memory grew by {grown:.0f} MiB with the page's body"
    assert job.result()["k"] == b"secret"  # its owner's job is untouched


def test_a_dns_rebinding_page_in_chromium_reads_only_refusals(
    kcoral_server, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    target = f"http://rebound.example:{kcoral_server.port}"
    page = f"{target}/web_page_attack.html{page_query(target, marker, 'job')}"
    seen = visit(page, target, rebound=True)
    assert_nothing_reached(seen, rebound=True)
    assert not marker.exists(), "the rebound page's program ran"
    assert "forbidden" in seen["typed"], seen["typed"]


def test_another_sites_page_in_chromium_reads_and_frames_nothing_of_a_router(
    attacker_port: int, tmp_path: Path
) -> None:
    router = start_router(tmp_path)
    try:
        marker = tmp_path / "ran"
        page = f"http://evil.example:{attacker_port}/web_page_attack.html"
        seen = visit(page + page_query(router.url, marker, "job"), router.url)
        assert_nothing_reached(seen)
        assert '"kcoral"' in seen["typed"] or '"status"' in seen["typed"], seen["typed"]
    finally:
        router.stop()
