"""Raw-HTTP helpers for the front-end tests (no dependency on ``kcoral.Client``).

The request and decoding are ``tests/raw_http.py``'s; what is here is the front-end's own:
``module_program`` calling several functions of one module.
"""

from __future__ import annotations

from typing import Any

from raw_http import Response, connection, decode, execute_body, request, sha256
from raw_http import post_execute as execute

__all__ = [
    "Response",
    "connection",
    "decode",
    "execute",
    "execute_body",
    "get",
    "module_program",
    "request",
    "sha256",
]


def get(url: str, path: str, headers: dict[str, str] | None = None) -> Response:
    return request(url, "GET", path, headers=headers)


def module_program(source: str, calls: list[tuple[str, list]], **options: Any) -> dict:
    """Upload ``source``, call each ``(function, args)`` and return its value under the
    function's name (``cpu_only`` when the name ends in ``_cpu``)."""
    instructions: list[dict] = [{"op": "upload", "id": "m", "kind": "module", "source": source}]
    for i, (name, args) in enumerate(calls):
        instructions.append(
            {
                "op": "get_function",
                "id": f"f{i}",
                "module": {"$ref": "m"},
                "name": name,
                **({"cpu_only": True} if name.endswith("_cpu") else {}),
            }
        )
        instructions.append({"op": "run", "id": f"r{i}", "fn": {"$ref": f"f{i}"}, "args": args})
        instructions.append({"op": "return", "key": f"{name}#{i}", "value": {"$ref": f"r{i}"}})
    program: dict[str, Any] = {"instructions": instructions}
    if options:
        program["options"] = options
    return program
