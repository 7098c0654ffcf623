"""Kernels announce which KCoral server their cells use; the server extension lists it with
the kernel's id, so that the JupyterLab status bar shows the server of the notebook in focus."""

from __future__ import annotations

import json
import os
import stat

from kcoral_jupyter.runtime_records import KernelConnection, kernel_connections
from kcoral_jupyter.server_extension import KCoralExtension


def test_a_kernel_announces_its_server_owner_only_and_withdraws_it(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    connection = KernelConnection("k-1")
    connection.announce("http://127.0.0.1:9001", "tok", embedded=False)
    assert connection.path is not None
    assert stat.S_IMODE(connection.path.stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "runtime").stat().st_mode) == 0o700
    [record] = kernel_connections()
    assert record["kernel_id"] == "k-1" and record["kernel_pid"] == os.getpid()
    connection.withdraw()
    assert kernel_connections() == []


def test_a_record_of_a_kernel_that_is_gone_is_ignored(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    connection = KernelConnection("k-dead")
    connection.announce("http://127.0.0.1:9001", "", embedded=False)
    record = json.loads(connection.path.read_text())
    connection.path.write_text(json.dumps({**record, "kernel_pid": 999_999_999}))
    assert kernel_connections() == []


def test_a_process_outside_jupyter_announces_nothing(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    connection = KernelConnection()  # no ipykernel connection file here
    connection.announce("http://127.0.0.1:9001", "", embedded=False)
    assert connection.path is None and kernel_connections() == []


def test_the_extension_lists_each_kernels_server_with_the_kernel_ids(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path / "runtime"))
    monkeypatch.delenv("KCORAL_URL", raising=False)
    KernelConnection("k-a").announce("http://127.0.0.1:9001", "ta", embedded=True)
    KernelConnection("k-b").announce("http://127.0.0.1:9002", "tb", embedded=False)
    KernelConnection("k-c").announce("http://127.0.0.1:9002", "tb", embedded=False)
    extension = KCoralExtension(
        servers=[{"name": "gpu", "url": "http://127.0.0.1:9002", "token": "conf"}]
    )
    listed = {entry["url"]: entry for entry in extension.resolved_servers()}
    assert listed["http://127.0.0.1:9002"]["name"] == "gpu"  # configured: its own name, token
    assert listed["http://127.0.0.1:9002"]["token"] == "conf"
    assert sorted(listed["http://127.0.0.1:9002"]["kernels"]) == ["k-b", "k-c"]
    assert listed["http://127.0.0.1:9001"]["name"] == "local-k-a"
    assert listed["http://127.0.0.1:9001"]["kernels"] == ["k-a"]
