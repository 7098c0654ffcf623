"""What a fresh worker no longer pays at start (issue 31): a spare worker started ahead must
be ready within one program's round trip, and in a fresh fork every lookup also copies the
pages it touches. The versions a worker reports are looked up once, by the fork server,
before it forks; a one-shot worker takes no snapshot for a next program it never runs."""

from __future__ import annotations

import linecache
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kcoral_server.processes.launcher.front_end import Launcher
from kcoral_server.worker import runtime
from kcoral_server.worker.warm_up import IDLE_BEFORE_WARM_UP_SECONDS
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


def _leaves_nothing_behind(warm: Callable[[], Any]) -> Any:
    """``warm()``'s result, asserting it registered no module, cached no source line and
    took no module number (the program's first module is still ``_1``)."""
    # what a worker (and its fork server) has loaded when it warms up
    import kcoral_server.worker.engine  # noqa: F401
    from kcoral_server.worker import modules

    import kcoral.protocol.validate
    import kcoral.protocol.values  # noqa: F401

    before_modules, before_lines = set(sys.modules), set(linecache.cache)
    serial_before = repr(modules._serial)
    result = warm()
    assert set(sys.modules) == before_modules
    assert set(linecache.cache) == before_lines
    assert repr(modules._serial) == serial_before
    return result


def test_the_warm_up_leaves_no_module_name_or_source_line_behind() -> None:
    from kcoral_server.worker.warm_up import warm_up

    assert _leaves_nothing_behind(warm_up) == {"type": "integer", "value": 42}


_SEEN = ("NAME", "WARM", "WARMED", "FORK_SERVER_WARMED")


def _first_program_sees(worker: Any) -> dict[str, Any]:
    """What a worker's first program finds: its module's name, cached source lines of the
    warm-up, whether the process warmed up, and whether its fork server did."""
    source = (
        "import linecache\n"
        "from kcoral_server.worker import warm_up\n"
        "from kcoral_server.processes.launcher import fork_server\n"
        "NAME = __name__\n"
        "WARM = [name for name in linecache.cache if 'warm' in name]\n"
        "WARMED = warm_up.warmed_up_at is not None\n"
        "FORK_SERVER_WARMED = fork_server.warmed_for_forks\n"
    )
    program = [module("m", source)]
    for name in _SEEN:
        program += [function(name, "m", name), give(name, name)]
    result = worker.run(program)
    assert result.finished.status == "COMPLETED", result.error
    return {name: result.value(name)["value"] for name in _SEEN}


def test_the_fork_servers_warm_up_runs_the_path_and_leaves_warmed_up_at_alone() -> None:
    from kcoral_server.worker import warm_up

    warmed_before = warm_up.warmed_up_at
    assert _leaves_nothing_behind(warm_up.warm_up_for_forks) is True
    assert warm_up.warmed_up_at == warmed_before


def test_a_forked_worker_inherits_its_fork_servers_warm_up_and_its_program_sees_nothing_of_it(
    tmp_path: Path,
) -> None:
    """The fork server ran a trivial program's path once before freezing its heap, so its
    workers start with what that path makes once; the program still finds its first
    module named ``_1``, no warm-up source line, and a worker that did not warm up itself."""
    launcher = Launcher()
    try:
        worker = launch(tmp_path, transient=True, launcher=launcher)
        assert worker.ready is not None, worker.failed
        seen = _first_program_sees(worker)
        assert seen["FORK_SERVER_WARMED"] is True
        assert seen["WARMED"] is False
        assert seen["NAME"].endswith("_1")
        assert seen["WARM"] == []
    finally:
        launcher.close()


def test_a_spare_left_waiting_for_its_program_warms_up_and_leaves_its_program_nothing(
    tmp_path: Path,
) -> None:
    """A CPU spare whose program does not come at once warms up: what the program sees of
    its process is as if nothing ran before it."""
    launcher = Launcher()
    try:
        worker = launch(tmp_path, transient=True, launcher=launcher, warm_up=True)
        assert worker.ready is not None, worker.failed
        time.sleep(IDLE_BEFORE_WARM_UP_SECONDS * 10)  # a person's pause before the next cell
        seen = _first_program_sees(worker)
        assert seen["WARMED"] is True
        assert seen["NAME"].endswith("_1")
        assert seen["WARM"] == []
    finally:
        launcher.close()


def test_a_spare_whose_program_is_already_waiting_runs_it_without_warming_up(
    tmp_path: Path,
) -> None:
    """Back to back, the program is there when the spare reports ready: warming up would
    only spend CPU the busy machine needs, so the spare runs the program at once."""
    launcher = Launcher()
    try:
        worker = launch(tmp_path, transient=True, launcher=launcher, warm_up=True, wait_ready=False)
        seen = _first_program_sees(worker)  # sent right behind the Configure
        assert seen["WARMED"] is False
        assert seen["NAME"].endswith("_1")
    finally:
        launcher.close()


def test_the_warm_up_stops_between_steps_when_the_program_comes() -> None:
    from kcoral_server.worker.warm_up import warm_up

    asked: list[int] = []

    def program_came() -> bool:
        asked.append(1)
        return True

    assert warm_up(stop=program_came) is None
    assert asked == [1]  # stopped at the first step's end


def test_a_worker_configured_while_its_program_waits_does_not_warm_up(tmp_path: Path) -> None:
    """A GPU spare is configured at take-over, with its program waiting: warming up then
    would only move the copied pages onto the same round trip."""
    launcher = Launcher()
    try:
        worker = launch(tmp_path, transient=True, launcher=launcher)
        assert worker.ready is not None, worker.failed
        assert _first_program_sees(worker)["WARMED"] is False
    finally:
        launcher.close()
