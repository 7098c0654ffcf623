"""A default above the most a program may ask for is said at start (``setting_clamped``,
SERVER §13): a program that asks for no timeout or output limit gets the max (PROTOCOL's
clamp), and the operator who set the default used to find out only from programs (flags
soak)."""

from __future__ import annotations

from pathlib import Path

from kcoral_server.settings.config import ServerConfig, clamped_defaults
from server_process import start_server


def test_defaults_within_their_maxima_say_nothing() -> None:
    assert clamped_defaults(ServerConfig()) == []


def test_a_server_with_defaults_above_their_maxima_says_what_programs_get(tmp_path: Path) -> None:
    args = ["--default-timeout-seconds", "1000", "--output-limit-bytes", "32M"]
    server = start_server(tmp_path / "server", args)
    try:
        said = [e for e in server.events() if e.get("event") == "setting_clamped"]
    finally:
        server.stop()
    assert [record["level"] for record in said] == ["WARNING", "WARNING"]
    assert [record["message"] for record in said] == [
        "--default-timeout-seconds 1000 is above --max-timeout-seconds 900: programs that ask "
        "for no timeout get 900 s",
        "--output-limit-bytes 33554432 is above --max-output-limit-bytes 16777216: programs "
        "that ask for no limit keep 16777216 bytes per stream",
    ]
