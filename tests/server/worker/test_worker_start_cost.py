"""What a fresh worker no longer pays at start (issue 31): a spare worker started ahead must
be ready within one program's round trip, and in a fresh fork every lookup also copies the
pages it touches. The versions a worker reports are looked up once, by the fork server,
before it forks; a one-shot worker takes no snapshot for a next program it never runs."""

from __future__ import annotations

import linecache
import sys
from pathlib import Path

from kcoral_server.processes.launcher.front_end import Launcher
from kcoral_server.worker import runtime
from worker_harness import function, give, launch, module


def test_the_reported_versions_are_looked_up_once_per_process() -> None:
    runtime.installed_version.cache_clear()
    runtime.remember_installed_versions()
    asked = runtime.installed_version.cache_info()
    assert asked.currsize == 1 + len(runtime._GPU_TOOLCHAIN)
    version = runtime.installed_version("torch")
    assert runtime.installed_version.cache_info().hits == asked.hits + 1
    assert version is not None  # this tree's test command installs torch


def test_a_forked_one_shot_worker_reports_its_versions_and_runs_a_workspace_import(
    tmp_path: Path,
) -> None:
    launcher = Launcher()
    try:
        worker = launch(tmp_path, transient=True, launcher=launcher)
        assert worker.ready is not None, worker.failed
        assert worker.ready.versions["torch"] == runtime.installed_version("torch")
        source = (
            "import sys, os\n"
            "open('helper_mod.py', 'w').write('VALUE = 5\\n')\n"
            "sys.path.insert(0, os.getcwd())\n"
            "import helper_mod\n"
            "assert helper_mod.VALUE == 5\n"
        )
        result = worker.run([module("m", source)])
        assert result.finished.status == "COMPLETED", result.error
        assert worker.proc.wait(30) == 0
    finally:
        launcher.close()


def test_the_warm_up_leaves_no_module_name_or_source_line_behind() -> None:
    # what a worker has loaded when it warms up
    import kcoral_server.worker.engine  # noqa: F401
    from kcoral_server.worker import modules
    from kcoral_server.worker.warm_up import warm_up

    import kcoral.protocol.validate
    import kcoral.protocol.values  # noqa: F401

    before_modules, before_lines = set(sys.modules), set(linecache.cache)
    serial_before = repr(modules._serial)
    assert warm_up() == {"type": "integer", "value": 42}
    assert set(sys.modules) == before_modules
    assert set(linecache.cache) == before_lines
    assert repr(modules._serial) == serial_before  # the program's first module is still _1


def test_a_warmed_up_one_shot_worker_gives_its_program_the_first_module_name(
    tmp_path: Path,
) -> None:
    """The warm-up runs before ready in every one-shot worker, forked or spawned: what the
    program sees of its process is as if nothing ran before it."""
    launcher = Launcher()
    try:
        worker = launch(tmp_path, transient=True, launcher=launcher)
        assert worker.ready is not None, worker.failed
        source = (
            "import linecache\n"
            "NAME = __name__\n"
            "WARM = [name for name in linecache.cache if 'warm' in name]\n"
        )
        result = worker.run(
            [module("m", source), function("f", "m", "NAME"), give("name", "f"),
             function("w", "m", "WARM"), give("warm", "w")]
        )  # fmt: skip
        assert result.finished.status == "COMPLETED", result.error
        assert result.value("name")["value"].endswith("_1")
        assert result.value("warm") == {"type": "array", "value": []}
    finally:
        launcher.close()
