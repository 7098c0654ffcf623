"""What a fresh worker no longer pays at start (issue 31): a spare worker started ahead must
be ready within one program's round trip, and in a fresh fork every lookup also copies the
pages it touches. The versions a worker reports are looked up once, by the fork server,
before it forks; a one-shot worker takes no snapshot for a next program it never runs."""

from __future__ import annotations

from pathlib import Path

from kcoral_server.processes.launcher.front_end import Launcher
from kcoral_server.worker import runtime
from worker_harness import launch, module


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
