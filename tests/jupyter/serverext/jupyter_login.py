"""A browser's login to the Jupyter server under test, for the cross-site tests."""

from __future__ import annotations

from typing import Any


async def login_cookies(http_server_client: Any, base_url: str, auth_header: dict) -> str:
    """The ``Cookie`` header a browser holds after opening the server's ``?token=`` link:
    what another site's page could make the browser send along."""
    token = auth_header["Authorization"].split()[-1]
    login = await http_server_client.fetch(
        f"{base_url}?token={token}", follow_redirects=False, raise_error=False
    )
    cookies = "; ".join(c.split(";")[0] for c in login.headers.get_list("Set-Cookie"))
    assert cookies
    return cookies
