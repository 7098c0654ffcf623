"""`pip install -e .` carries the data files too: the Jupyter server extension's auto-enable
config and the prebuilt JupyterLab extension (build_backend/kcoral_build_backend.py)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_an_editable_wheel_holds_the_jupyter_config_and_the_labextension(tmp_path) -> None:
    code = (
        "import sys; sys.path.insert(0, 'build_backend'); import kcoral_build_backend as b;"
        f"print(b.build_editable({str(tmp_path)!r}))"
    )
    built = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True
    )
    wheel = tmp_path / built.stdout.strip().splitlines()[-1]
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        record = archive.read(next(n for n in names if n.endswith(".dist-info/RECORD")))
    data = [n for n in names if ".data/data/" in n]
    assert any(n.endswith("etc/jupyter/jupyter_server_config.d/kcoral_jupyter.json") for n in data)
    assert any(
        "share/jupyter/labextensions/kcoral-jupyterlab/static/remoteEntry." in n for n in data
    )
    for name in data:  # every added file is listed, with its hash, in RECORD
        assert f"{name},sha256=".encode() in record


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["wheel", "editable"])
def test_a_wheel_builds_without_node_and_imports_under_the_three_names(tmp_path, kind) -> None:
    """`pip install .` and `pip install -e .` build through this backend with no node on PATH
    (the JupyterLab extension is prebuilt and committed)."""
    code = (
        "import sys; sys.path.insert(0, 'build_backend'); import kcoral_build_backend as b;"
        f"print(b.build_{kind}({str(tmp_path)!r}))"
    )
    path = str(Path(sys.executable).parent)  # the interpreter's folder only: no node here
    built = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": path, "HOME": str(tmp_path)},
    )
    wheel = tmp_path / built.stdout.strip().splitlines()[-1]
    unpacked = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        archive.extractall(unpacked)
    assert any(
        n.endswith("share/jupyter/labextensions/kcoral-jupyterlab/package.json") for n in names
    )
    if kind == "wheel":
        tops = {n.split("/", 1)[0] for n in names if "/" in n and ".dist-info" not in n}
        assert {"kcoral", "kcoral_server", "kcoral_jupyter"} <= tops
        assert "kcoral_server/proto/kcoral_gateway_pb2.py" in names
    if kind == "wheel":
        probe = "import kcoral, kcoral_server.settings.config, kcoral_jupyter; print(kcoral_server.__file__)"
        where = subprocess.run(
            [sys.executable, "-c", probe],
            capture_output=True,
            text=True,
            env={"PYTHONPATH": str(unpacked), "PATH": path},
            cwd=tmp_path,
        )
        assert where.returncode == 0, where.stderr
        assert where.stdout.startswith(str(unpacked)), where.stdout
