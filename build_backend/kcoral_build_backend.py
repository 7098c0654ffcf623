"""setuptools' PEP 517 backend, plus data files in editable wheels.

setuptools builds editable wheels (``pip install -e .``) without the ``data-files`` of
pyproject.toml, so the Jupyter server extension's auto-enable config and the prebuilt
JupyterLab extension would be missing from an editable install. This wrapper adds them to
the editable wheel's ``.data/data/`` directory (with RECORD entries), exactly where a normal
wheel puts them. Everything else is setuptools' own backend.

Why not hatchling with hatch-jupyter-builder, the JupyterLab extension template's backend:
its regular wheels map our folders to their import names (``sources``: ``server`` →
``kcoral_server``, ``jupyter_ext`` → ``kcoral_jupyter``) and carry the data files
(``shared-data``), but ``pip install -e .`` then fails: hatchling's dev mode refuses a
``sources`` rewrite that changes a prefix rather than removes it ("Dev mode installations
are unsupported when any path rewrite in the `sources` option changes a prefix", editables
issue 20), with or without ``dev-mode-exact``. Tried with hatchling 1.33 on 2026-12-01.
The builder part is not needed either: the built extension is committed, so no install
runs node.
"""

from __future__ import annotations

import base64
import glob
import hashlib
import os
import zipfile
from pathlib import Path

from setuptools import build_meta
from setuptools.build_meta import *  # noqa: F403 - re-export the whole PEP 517 interface
from setuptools.config.pyprojecttoml import read_configuration


def build_editable(
    wheel_directory: str,
    config_settings: dict | None = None,
    metadata_directory: str | None = None,
) -> str:
    name = build_meta.build_editable(wheel_directory, config_settings, metadata_directory)
    add_data_files(Path(wheel_directory) / name, Path.cwd())
    return name


def data_files(root: Path) -> list[tuple[str, Path]]:
    """(destination relative to the data root, source file) for every data-files entry."""
    table = read_configuration(root / "pyproject.toml")["tool"]["setuptools"]
    found: list[tuple[str, Path]] = []
    entries = table.get("data-files", {})
    # setuptools returns the table as a dict, or already expanded as (destination, files)
    for destination, patterns in entries.items() if isinstance(entries, dict) else entries:
        for pattern in patterns:
            for source in sorted(glob.glob(str(root / pattern))):
                if os.path.isfile(source):
                    found.append((f"{destination}/{os.path.basename(source)}", Path(source)))
    return found


def add_data_files(wheel: Path, root: Path) -> None:
    files = data_files(root)
    if not files:
        return
    with zipfile.ZipFile(wheel) as original:
        entries = [(info, original.read(info)) for info in original.infolist()]
    record_name = next(info.filename for info, _ in entries if info.filename.endswith("RECORD"))
    data_dir = record_name.split("/", 1)[0].replace(".dist-info", ".data") + "/data"
    added = [(f"{data_dir}/{destination}", source.read_bytes()) for destination, source in files]
    lines = [line for line in _record(entries, record_name).splitlines() if line]
    for arcname, content in added:
        digest = base64.urlsafe_b64encode(hashlib.sha256(content).digest()).rstrip(b"=")
        lines.insert(len(lines) - 1, f"{arcname},sha256={digest.decode()},{len(content)}")
    temporary = wheel.with_suffix(".tmp")
    with zipfile.ZipFile(temporary, "w", zipfile.ZIP_DEFLATED) as rebuilt:
        for info, content in entries:
            if info.filename != record_name:
                rebuilt.writestr(info, content)
        for arcname, content in added:
            rebuilt.writestr(arcname, content)
        rebuilt.writestr(record_name, "\n".join(lines) + "\n")
    temporary.replace(wheel)


def _record(entries: list[tuple[zipfile.ZipInfo, bytes]], record_name: str) -> str:
    return next(content for info, content in entries if info.filename == record_name).decode()
