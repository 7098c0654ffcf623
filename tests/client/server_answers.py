"""Answer bodies a KCoral server sends (PROTOCOL §7), shared by the client tests that stand
in for a server (a fake HTTP server, or ``MockTransport``)."""

from __future__ import annotations

from typing import Any

REQUEST_ID = "0b5c1f7e-3a0d-4c53-9d0e-6f1a2b3c4d5e"


def completed(**extra: Any) -> dict[str, Any]:
    """A ``COMPLETED`` JSON body (no returns unless ``results`` is given)."""
    body = {
        "status": "COMPLETED",
        "request_id": REQUEST_ID,
        "queue_ms": 0.4,
        "elapsed_ms": 12,
        "lease_wait_ms": 0.0,
        "lease_held_ms": 1.5,
        "stdout": "hi\n",
        "stderr": "",
        "stdout_truncated": False,
        "stderr_truncated": False,
        "results": {},
    }
    body.update(extra)
    return body


def cache_miss(*hashes: str) -> dict[str, Any]:
    """A ``CACHE_MISS`` body naming the blobs the server lacks."""
    return {"status": "CACHE_MISS", "request_id": REQUEST_ID, "missing_blobs": list(hashes)}
