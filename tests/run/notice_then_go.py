"""A ``kcoral run`` process that waits for something another program holds: read its
stderr until it says ``notice``, then let it go on (a module name unique across the test
tree, so plain ``import`` finds it from any folder)."""

from __future__ import annotations

import subprocess
import threading
from collections.abc import Callable

#: Only a bound for code that never says the notice: it comes after about 1 s.
GIVE_UP_SECONDS = 60.0


def said_until_notice_then_go(
    run: subprocess.Popen[str], notice: str, go: Callable[[], object]
) -> tuple[list[str], str]:
    """Read ``run``'s stderr until ``notice``, call ``go`` (it frees what the run waits
    for; also called after ``GIVE_UP_SECONDS`` without it), and wait for the run to end:
    every line it said on stderr, and its stdout."""
    give_up = threading.Timer(GIVE_UP_SECONDS, go)
    give_up.start()
    said: list[str] = []
    try:
        assert run.stderr is not None
        for line in run.stderr:
            said.append(line.rstrip("\n"))
            if line.rstrip("\n") == notice:
                go()
                break
        out, err = run.communicate(timeout=120)
    finally:
        give_up.cancel()
        go()
        if run.poll() is None:
            run.kill()
            run.wait()
    return said + err.splitlines(), out
