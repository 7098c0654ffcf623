"""A router refuses a metrics token no scraper can send, as a server does (EXTENSIONS §13:
printable ASCII without spaces, as any token): ``kcoral router --metrics-token`` or
``KCORAL_METRICS_TOKEN`` with an inner space, an escape or an accented letter exits 2 at
start, naming where the token came from and never showing it.

Before, the router checked only for an empty token or spaces at its ends: ``'scr ape'``
started a router whose ``/metrics`` no scraper could ever open, where ``kcoral server``
refused the same value.
"""

from __future__ import annotations

import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))

from router_helpers import start_router

NODES = {"KCORAL_NODE_TOKEN": "n0de"}  # a router with a client token needs one (ROUTER §3)
UNSENDABLE = ["scr ape", "scr\x1bape", "scr\u00e9pe", "scrape\n"]


def _refusal(tmp_path: Path, *args: str, env: dict[str, str] | None = None) -> str:
    """What a router said when it refused to start; one that started is stopped, then the
    test fails."""
    try:
        started = start_router(tmp_path, *args, env=env)
    except RuntimeError as exc:
        return str(exc)
    started.stop()
    raise AssertionError("the router started with a metrics token no header can carry")


@pytest.mark.parametrize("value", UNSENDABLE)
def test_a_router_refuses_a_metrics_flag_no_header_can_carry(tmp_path: Path, value: str) -> None:
    said = _refusal(tmp_path, "--metrics-token", value)
    assert "--metrics-token must be printable ASCII without spaces" in said
    assert "scr" not in said


def test_a_router_refuses_such_a_metrics_token_from_its_variable(tmp_path: Path) -> None:
    said = _refusal(tmp_path, env={"KCORAL_METRICS_TOKEN": "scr ape"})
    assert "KCORAL_METRICS_TOKEN must be printable ASCII without spaces" in said
    assert "scr" not in said


def test_an_empty_metrics_token_flag_is_refused_as_empty(tmp_path: Path) -> None:
    assert "--metrics-token must not be empty" in _refusal(tmp_path, "--metrics-token", "")


def test_an_empty_metrics_token_variable_is_unset_as_on_a_server(tmp_path: Path) -> None:
    """A unit file's ``KCORAL_METRICS_TOKEN=`` started the server and stopped the router
    beside it: both now read it as no metrics token (a client token still opens /metrics)."""
    router = start_router(
        tmp_path, env={"KCORAL_METRICS_TOKEN": "", "KCORAL_AUTH_TOKEN": "t0k", **NODES}
    )
    try:
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(f"{router.url}/metrics", timeout=30)
        assert refused.value.code == 401
        scrape = urllib.request.Request(
            f"{router.url}/metrics", headers={"Authorization": "Bearer t0k"}
        )
        with urllib.request.urlopen(scrape, timeout=30) as answer:
            assert answer.status == 200
    finally:
        router.stop()
