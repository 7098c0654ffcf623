"""A page the router's operator allow-listed (``--allowed-origin``) reaches the nodes
through the router (EXTENSIONS §6, ROUTER §8.4): the router checks the page's ``Origin``
and fetch metadata, and neither goes on to the node. Before, the router dropped ``Origin``
but passed ``Sec-Fetch-Site``, and the node refused what the router had let in (``403``
"a 'empty' request from a page of another origin"). A real router and a real CPU node."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "router"))
from router_helpers import Node, http_request, ready_nodes, start_router, stopping
from server_process import client_token_file

pytestmark = pytest.mark.slow

TOKEN = "allowed-page-client-token"
NODE_ENV = {"KCORAL_NODE_TOKEN": "allowed-page-node-token"}
ALLOWED = "https://lab.example.org"


def test_a_page_the_router_allows_opens_a_session_on_its_node(tmp_path: Path) -> None:
    tokens = client_token_file(tmp_path, f"alice {TOKEN}\n")
    router = start_router(
        tmp_path, "--auth-token-file", str(tokens), "--allowed-origin", ALLOWED, env=NODE_ENV
    )
    node = Node(tmp_path, router, "n1", NODE_ENV)
    with stopping(router, [node]):
        ready_nodes(router, 1)
        # what Chromium sends for the page's fetch(ROUTER + '/v1/sessions', {method: 'POST'})
        browser = [
            ("Authorization", f"Bearer {TOKEN}"),
            ("Origin", ALLOWED),
            ("Sec-Fetch-Site", "cross-site"),
            ("Sec-Fetch-Mode", "cors"),
            ("Sec-Fetch-Dest", "empty"),
            ("Content-Type", "application/json"),
        ]
        answer = asyncio.run(
            http_request(router.port, "POST", "/v1/sessions", b"{}", headers=browser)
        )
    assert answer.status == 201, answer.body
    assert json.loads(answer.body)["owner"] == "alice", answer.body
