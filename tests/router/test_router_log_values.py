"""The router's plain-text lines write lists and dicts as JSON, as the server's events do
(ROUTER §10)."""

from __future__ import annotations

import io

from kcoral_server.router.log import RouterLog


def _line(**fields: object) -> str:
    stream = io.StringIO()
    RouterLog(stream).event("tokens_reloaded", **fields)
    return stream.getvalue()


def test_a_router_line_writes_a_list_of_names_as_json() -> None:
    line = _line(revoked=["bob"], added=["alice", "carol"], identities=2)
    assert ' revoked=["bob"] added=["alice","carol"] identities=2\n' in line, line


def test_a_router_line_writes_a_dict_as_compact_json() -> None:
    line = _line(failed={"node-a": "timed out"})
    # a value with a space is quoted whole, as any router value with a space is
    assert """ failed='{"node-a":"timed out"}'\n""" in line, line
