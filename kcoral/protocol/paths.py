"""Workspace path rules of PROTOCOL.md §5.5, shared by client and server."""

from __future__ import annotations

from kcoral.protocol.errors import ValidationError

MAX_COMPONENT_BYTES = 255
MAX_PATH_BYTES = 4096


def normalize_workspace_path(path: object) -> str:
    """Validate ``path`` and return its normalized form (``./a//b`` -> ``a/b``).

    Raises ``ValidationError`` naming the broken rule.
    """
    if not isinstance(path, str):
        raise ValidationError(f"path must be a string, not {type(path).__name__}")
    if not path:
        raise ValidationError("path must not be empty")
    if path.startswith("/"):
        raise ValidationError(f"path {path!r} must be relative")
    if "\x00" in path:
        raise ValidationError("path must not contain NUL")
    if "\\" in path:
        raise ValidationError(f"path {path!r} must not contain a backslash")
    parts = path.split("/")
    if ".." in parts:
        raise ValidationError(f"path {path!r} must not contain a '..' component")
    kept = [part for part in parts if part not in ("", ".")]
    if not kept:
        raise ValidationError(f"path {path!r} is empty after normalization")
    for part in kept:
        try:
            size = len(part.encode("utf-8"))
        except UnicodeEncodeError:
            raise ValidationError(f"path {path!r} is not valid UTF-8") from None
        if size > MAX_COMPONENT_BYTES:
            raise ValidationError(f"path component longer than {MAX_COMPONENT_BYTES} bytes")
    normalized = "/".join(kept)
    if len(normalized.encode("utf-8")) > MAX_PATH_BYTES:
        raise ValidationError(f"path longer than {MAX_PATH_BYTES} bytes")
    return normalized


def conflicting_paths(paths: list[str]) -> tuple[str, str] | None:
    """First pair of normalized paths that are equal or a file-vs-directory conflict."""
    seen: set[str] = set()
    for path in paths:
        if path in seen:
            return path, path
        seen.add(path)
    for path in paths:
        parts = path.split("/")
        for i in range(1, len(parts)):
            prefix = "/".join(parts[:i])
            if prefix in seen:
                return prefix, path
    return None
