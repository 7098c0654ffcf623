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
