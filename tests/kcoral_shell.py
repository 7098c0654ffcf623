"""The process's IPython shell with ``kcoral_jupyter`` loaded, its cells going to one URL:
shared by the magic tests and the malicious-server tests (a module name unique across the
test tree, so plain ``import`` finds it from any folder)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.testing import globalipapp


@contextlib.contextmanager
def kcoral_shell(
    url: str, monkeypatch: pytest.MonkeyPatch, bound_names: Iterable[str]
) -> Iterator[Any]:
    """Load the extension with ``KCORAL_URL=url`` (no token); afterwards unload it and drop
    ``bound_names`` from the namespace, so that the next test starts clean."""
    monkeypatch.setenv("KCORAL_URL", url)
    monkeypatch.delenv("KCORAL_TOKEN", raising=False)
    globalipapp.start_ipython()  # once per process; later calls return None
    ip = InteractiveShell.instance()
    ip.config.pop("KCoral", None)  # `%config KCoral.*` of an earlier test must not leak in
    ip.run_line_magic("load_ext", "kcoral_jupyter")
    try:
        yield ip
    finally:
        ip.run_line_magic("unload_ext", "kcoral_jupyter")
        for name in bound_names:
            ip.user_ns.pop(name, None)
