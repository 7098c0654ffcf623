"""A program that holds its worker (and the GPU lease of its ``run``) until a file appears,
for tests that need a GPU held while they look at what waits for it (a module name unique
across the test tree, so plain ``import`` finds it from any folder)."""

from __future__ import annotations

from pathlib import Path

import kcoral

SOURCE = """
import os, time
def hold(marker, go):
    open(marker, "w").close()
    while not os.path.exists(go):
        time.sleep(0.01)
    return 1
def log(path, name):
    with open(path, "a") as out:
        out.write(name + "\\n")
    return 1
"""


def call(name: str, *args: str) -> kcoral.Program:
    """A program that runs ``name(*args)`` of ``SOURCE`` and returns its value as ``r``."""
    program = kcoral.Program()
    module = program.upload(kind="module", source=SOURCE, id="m")
    function = program.get_function(module=module, name=name, id="fn")
    program.return_(key="r", value=program.run(fn=function, args=list(args), id="r"))
    return program


def holding(marker: Path, go: Path) -> kcoral.Program:
    """Touches ``marker`` once it runs, then holds until ``go`` exists."""
    return call("hold", str(marker), str(go))
