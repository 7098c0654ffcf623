"""A real CPU KCoral server for the Jupyter tests (``json_only_server_url`` is shared, in
``tests/conftest.py``), and an in-process IPython shell with the extension loaded."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from IPython.core.interactiveshell import InteractiveShell
from IPython.testing import globalipapp
from server_process import running_server


@pytest.fixture(scope="session")
def cpu_server_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One CPU server (two reused workers, pickle allowed) shared by the Jupyter tests."""
    with running_server(
        tmp_path_factory.mktemp("jupyter-server"),
        ["--log-dir", "", "--num-workers", "2"],
        env={"KCORAL_ALLOWED_SERIALIZATION": "json,pickle"},
    ) as server:
        yield server.url


@pytest.fixture
def shell(cpu_server_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The process's IPython shell with ``kcoral_jupyter`` loaded, cells going to
    ``cpu_server_url``; unloaded (and the names tests bind removed) afterwards."""
    monkeypatch.setenv("KCORAL_URL", cpu_server_url)
    monkeypatch.delenv("KCORAL_TOKEN", raising=False)
    globalipapp.start_ipython()  # once per process; later calls return None
    ip = InteractiveShell.instance()
    ip.config.pop("KCoral", None)  # `%config KCoral.*` of an earlier test must not leak in
    ip.run_line_magic("load_ext", "kcoral_jupyter")
    try:
        yield ip
    finally:
        ip.run_line_magic("unload_ext", "kcoral_jupyter")
        for name in (
            "x",
            "y",
            "z",
            "n",
            "obj",
            "job",
            "_kcoral",
            "text",
            "blob",
            "t",
            "a",
            "b",
            "w",
            "v",
        ):
            ip.user_ns.pop(name, None)
