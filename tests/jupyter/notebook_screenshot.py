"""Render an executed notebook to a PNG for the README (``KCORAL_SCREENSHOT_DIR``), with
nbconvert's lab template and headless Chromium; a no-op unless asked for."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import nbformat


def screenshot(cells: list[Any], name: str, tmp_path: Path, *, height: int) -> None:
    """Write ``cells`` as ``name`` into ``$KCORAL_SCREENSHOT_DIR`` (when it and chromium
    are there), ``height`` pixels of a 1200-pixel-wide page."""
    folder = os.environ.get("KCORAL_SCREENSHOT_DIR")
    chromium = shutil.which("chromium")
    if not folder or not chromium:
        return
    from nbconvert import HTMLExporter

    html, _ = HTMLExporter(template_name="lab").from_notebook_node(
        nbformat.v4.new_notebook(cells=cells)
    )
    page = tmp_path / f"{Path(name).stem}.html"
    page.write_text(html, encoding="utf-8")
    subprocess.run(
        [
            chromium,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--hide-scrollbars",
            f"--screenshot={Path(folder).resolve() / name}",
            f"--window-size=1200,{height}",
            "--virtual-time-budget=5000",
            page.as_uri(),
        ],
        check=True,
        capture_output=True,
        timeout=120,
    )
