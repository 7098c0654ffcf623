"""docs/architecture.md maps every module of the three package trees: a newcomer who opens
a file finds its one line there, and one who reads the map finds every file. Modules added
without a line (``kcoral/bench/deadline.py``, ``node/control_slots.py``, ...) left the map
silently short.
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREES = ("kcoral", "server/kcoral_server", "jupyter_ext/kcoral_jupyter")


def _modules() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "--", *(f"{tree}/*.py" for tree in TREES)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    return [path for path in listed if Path(path).name not in ("__init__.py", "__main__.py")]


def test_every_module_of_the_package_trees_has_a_line_in_the_architecture_map() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text(encoding="utf-8")
    named = set(re.findall(r"[\w*]+\.py\b", text))  # kcoral_gateway_pb2*.py names a family
    missing = [
        path
        for path in _modules()
        if not any(fnmatch.fnmatchcase(Path(path).name, name) for name in named)
    ]
    assert missing == [], f"modules without a line in docs/architecture.md: {missing}"
