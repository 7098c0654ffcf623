"""``%config KCoral`` lists the settings with their current values, the token's only as set or
unset.

Before, traitlets' listing ended each setting with ``Current:`` and its value's repr, the
token's included: ``%config KCoral``, run to see what can be set, printed the user's bearer
token into the notebook, which keeps it in the saved file (shared, committed, exported)."""

from __future__ import annotations

import pytest
from kcoral_shell import kcoral_shell

SECRET = "kc-secret-token-4f9a1b7e"


def test_the_config_listing_shows_the_token_as_set_never_its_value(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    with kcoral_shell("http://127.0.0.1:9", monkeypatch, ()) as ip:
        ip.run_line_magic("config", "KCoral")
        unset = capsys.readouterr().out
        ip.run_line_magic("config", f"KCoral.token = {SECRET!r}")
        ip.run_line_magic("config", "KCoral")
        listed = capsys.readouterr().out
    token_entry = listed.split("KCoral.token=", 1)[1].split("KCoral.url=", 1)[0]
    assert "Current: <set>" in token_entry, token_entry
    assert SECRET not in listed
    assert "Current: <unset>" in unset.split("KCoral.token=", 1)[1].split("KCoral.url=", 1)[0]
    # the other settings still say their values
    assert "Current: 'http://127.0.0.1:9'" in listed
