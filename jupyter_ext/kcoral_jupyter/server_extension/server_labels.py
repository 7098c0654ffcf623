"""Names a person recognises for the KCoral servers the panel lists.

The server extension knows each server by a routing name (``?server=NAME``): the name the
configuration gives it, ``default`` for ``KCORAL_URL``, ``local-<pid>`` for a kernel's
embedded server and ``kernel-<id>`` for a URL a kernel connected to. Those last two say
nothing to a person, so each server also gets a ``label``: the configured name, "local
server of quickstart.ipynb" (the notebook of the kernel that started it, from the Jupyter
server's sessions), or its URL; and ``notebooks``, the notebooks whose kernels use it.
"""

from __future__ import annotations

import posixpath
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import urlsplit

# Routing names the extension makes up (KCoralExtension.resolved_servers).
MADE_UP_PREFIXES = ("local-", "kernel-")
NOTEBOOKS_IN_A_LABEL = 2


def notebooks_of(kernel_ids: Iterable[str], paths: Mapping[str, str]) -> list[str]:
    """The notebooks (file names, in order, once each) whose kernels are ``kernel_ids``."""
    names: list[str] = []
    for kernel_id in kernel_ids:
        path = paths.get(kernel_id)
        if path:
            name = posixpath.basename(path) or path
            if name not in names:
                names.append(name)
    return names


def url_label(url: str) -> str:
    """``host:port`` of a URL (its scheme when not plain http), else the URL."""
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if not parts.netloc:
        return url
    shown = parts.netloc + parts.path.rstrip("/")
    return shown if parts.scheme == "http" else f"{parts.scheme}://{shown}"


def server_label(entry: Mapping[str, Any], owners: list[str]) -> str:
    """What the panel calls one server; ``owners``: for a kernel's embedded server, the
    notebook of the kernel that started it."""
    name = str(entry.get("name", ""))
    if entry.get("embedded"):
        notebooks = owners
        if not notebooks:
            return "local server of a kernel"
        shown = ", ".join(notebooks[:NOTEBOOKS_IN_A_LABEL])
        more = len(notebooks) - NOTEBOOKS_IN_A_LABEL
        return f"local server of {shown}" + (f" and {more} more" if more > 0 else "")
    if not name or name.startswith(MADE_UP_PREFIXES) or name == "default":
        return url_label(str(entry.get("url", "")))
    return name
