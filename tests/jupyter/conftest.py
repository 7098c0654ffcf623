"""A real CPU KCoral server for the Jupyter tests (``json_only_server_url`` is shared, in
``tests/conftest.py``), and an in-process IPython shell with the extension loaded: its
cells going to that server (``shell``), or to the embedded server it starts
(``embedded_shell``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from kcoral_jupyter.extension import kernel_state_of
from kcoral_shell import kcoral_shell
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
    names = ("x", "y", "z", "n", "obj", "job", "_kcoral", "text", "blob", "t", "a", "b", "w", "v")
    with kcoral_shell(cpu_server_url, monkeypatch, names) as ip:
        yield ip


#: Arguments of an embedded server that starts fast (``KCoral.local_args``).
FAST_LOCAL = ["--device", "cpu", "--sandbox", "none", "--log-dir", "", "--disk-cache-dir", ""]


@pytest.fixture
def embedded_shell(tmp_path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The shell with no server configured: cells start the embedded one (``FAST_LOCAL``),
    advertised in a runtime directory of the test's own; stopped afterwards."""
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    with kcoral_shell("", monkeypatch, ()) as ip:
        kernel_state_of(ip).settings.local_args = FAST_LOCAL
        yield ip
        kernel_state_of(ip).stop_local()
