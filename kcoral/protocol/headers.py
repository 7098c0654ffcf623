"""Header rules of PROTOCOL.md §8."""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence

REQUEST_ID_HEADER = "X-Request-ID"
NODE_HEADER = "X-KCoral-Node"
SERIALIZATION_HEADER = "X-KCoral-Serialization"
#: ``POST /v1/jobs``: cancel the job once no event stream has followed it for this many
#: seconds (EXTENSIONS.md §5)
CANCEL_UNFOLLOWED_HEADER = "X-KCoral-Cancel-Unfollowed"
#: ``POST /execute``: ``1`` asks that a 504 ``timeout`` carry what the program printed
#: (EXTENSIONS.md §15); without it the body is PROTOCOL §7.4's exact three fields
TIMEOUT_OUTPUT_HEADER = "X-KCoral-Timeout-Output"
#: Its values: remote-function argument/result formats (EXTENSIONS.md §4).
SERIALIZATION_FORMATS = ("json", "pickle")
MAX_NODE_ECHO_CHARS = 512
#: What a bearer token may hold, on both sides: printable ASCII, no space. A header value's
#: other bytes reach a server differently from each client (Latin-1 or UTF-8), and a control
#: character (a NUL, a stray escape, a newline read with the file) is not what anyone means
#: to type.
PRINTABLE_TOKEN = re.compile(r"[\x21-\x7e]+")


def is_canonical_uuid(value: object) -> bool:
    """True for a canonical lowercase hyphenated UUID of any version."""
    if not isinstance(value, str):
        return False
    try:
        return str(uuid.UUID(value)) == value
    except ValueError:
        return False


def accept_request_id(values: Sequence[str]) -> str:
    """The request id to use: the client's only if it sent exactly one canonical UUID."""
    if len(values) == 1 and is_canonical_uuid(values[0]):
        return values[0]
    return str(uuid.uuid4())


def node_preference(value: str | None) -> str | None:
    """The ``X-KCoral-Node`` value a client echoes on its next attempt (1–512 characters)."""
    if value is None or not 1 <= len(value) <= MAX_NODE_ECHO_CHARS:
        return None
    return value
