"""A remote function's call whose error KCoral rewords for its user (a 500
``response_too_large`` names the function, a 504 ``timeout`` the decorator's setting,
CLIENT_API §8) keeps everything else the answer said, as ``execute()``'s error does: its
``Retry-After``, what the program printed before its deadline, its request id. The
reworded error was rebuilt from the status, kind and id alone, so a caller pausing for
``retry_after`` read None and a timed-out call's prints were gone."""

from __future__ import annotations

from typing import Any

import pytest

from kcoral import Client
from kcoral.errors import KCoralError

REQUEST_ID = "req-kept"


def nap() -> None:
    pass


def error_body(kind: str, message: str, **more: Any) -> dict[str, Any]:
    return {
        "status": "ERROR",
        "request_id": REQUEST_ID,
        "error": {"kind": kind, "message": message},
        **more,
    }


@pytest.mark.parametrize(
    ("status", "body", "said"),
    [
        (
            500,
            error_body("response_too_large", "results exceed the configured response-size limit"),
            "nap(): results exceed the configured response-size limit",
        ),
        (
            504,
            error_body(
                "timeout",
                "execution timed out after its deadline of 1 s (timeout_seconds=1)",
                stdout="printed before\n",
            ),
            "execution timed out after its deadline of 1 s (nap()'s timeout=1; "
            "@client.function(timeout=...) raises it)",
        ),
    ],
)
def test_a_reworded_call_error_keeps_its_retry_after_output_and_request_id(
    canned_server: Any, status: int, body: dict[str, Any], said: str
) -> None:
    canned_server.add(body, status=status, headers={"Retry-After": "7"})
    with Client(canned_server.url) as client:
        with pytest.raises(KCoralError) as caught:
            client.function(timeout=1)(nap).remote()
    error = caught.value
    assert (error.status_code, error.kind, error.message) == (status, body["error"]["kind"], said)
    assert (error.retry_after, error.request_id) == (7.0, REQUEST_ID)
    if status == 504:
        assert error.output is not None and error.output.stdout == "printed before\n"
