"""What a reused worker forgets between programs, on the cheaper clean-up paths (round 6):
the workspace's path importers, modules next to odd ``sys.modules`` entries (unhashable,
failing comparisons), and a native environment that ``setenv`` had to move."""

from __future__ import annotations

import pytest
from kcoral_server.worker.engine import (
    FULL_COLLECTION_EVERY,
    FULL_COLLECTION_MAX_SPACING,
    full_collection_spacing,
)
from worker_harness import call, function, give, module

PROBE = (
    "import os, subprocess, sys\n"
    "def state(old_workspace):\n"
    # waited for: a child still exiting at the end of the program would count as left over
    "    native = subprocess.run(['env'], capture_output=True, text=True).stdout\n"
    "    return {\n"
    "        'importers': [k for k in sys.path_importer_cache\n"
    "                      if isinstance(k, str) and k.startswith(old_workspace)],\n"
    "        'helper': 'hygiene_helper' in sys.modules,\n"
    "        'native': native.count('KCORAL_MOVED_'),\n"
    "        'python': sum(k.startswith('KCORAL_MOVED_') for k in os.environ),\n"
    "    }\n"
)


def _probe(worker, old_workspace: str) -> dict:
    result = worker.run(
        [
            module("p", PROBE),
            function("state", "p", "state"),
            call("s", "state", old_workspace),
            give("s", "s"),
        ]
    )
    assert result.finished.status == "COMPLETED", result.error
    return {k: v["value"] for k, v in result.value("s")["value"].items()}


def test_a_reused_worker_forgets_the_path_importers_and_modules_of_a_deleted_workspace(
    start_worker,
):
    worker = start_worker()
    source = (
        "import os, sys\n"
        "os.makedirs('pkg')\n"
        "open('pkg/hygiene_helper.py', 'w').write('VALUE = 1\\n')\n"
        "sys.path.insert(0, os.getcwd() + '/pkg')\n"
        "import hygiene_helper\n"
        "assert any(str(k).endswith('/pkg') for k in sys.path_importer_cache)\n"
    )
    first = worker.run([module("m", source)])
    assert first.finished.status == "COMPLETED", first.error
    state = _probe(worker, str(first.workspace))
    assert state["importers"] == []
    assert state["helper"] is False


def test_odd_values_in_sys_modules_do_not_stop_the_module_clean_up(start_worker):
    worker = start_worker()
    source = (
        "import os, sys\n"
        "class Odd:\n"
        "    __hash__ = None\n"
        "    def __eq__(self, other):\n"
        "        raise RuntimeError('no comparing me')\n"
        "sys.modules['kcoral_odd_entry'] = Odd()\n"
        "sys.modules['json'] = Odd()\n"  # replaces a module the worker had: compared
        "open('hygiene_helper.py', 'w').write('VALUE = 1\\n')\n"
        "sys.path.insert(0, os.getcwd())\n"
        "import hygiene_helper\n"
    )
    first = worker.run([module("m", source)])
    assert first.finished.status == "COMPLETED", first.error
    state = _probe(worker, str(first.workspace))
    assert state["helper"] is False


def test_native_variables_are_removed_also_after_setenv_moved_the_environment(start_worker):
    worker = start_worker()
    source = (
        "import ctypes\n"
        "libc = ctypes.CDLL(None)\n"
        "for i in range(300):\n"  # enough to make libc reallocate its environ array
        "    libc.setenv(f'KCORAL_MOVED_{i}'.encode(), b'x', 1)\n"
    )
    first = worker.run([module("m", source)])
    assert first.finished.status == "COMPLETED", first.error
    state = _probe(worker, str(first.workspace))
    assert state["native"] == 0
    assert state["python"] == 0


def test_each_program_imports_its_own_workspace_module_of_the_same_name(start_worker):
    # the engine's module snapshot is only copied again after a program changed sys.modules
    worker = start_worker()
    importer = (
        "import os, sys\n"
        "def load(value):\n"
        "    open('hygiene_helper.py', 'w').write(f'VALUE = {value}\\n')\n"
        "    sys.path.insert(0, os.getcwd())\n"
        "    import hygiene_helper\n"
        "    return hygiene_helper.VALUE\n"
    )
    workspaces = []
    for value in (1, 2, 3):
        result = worker.run(
            [
                module("m", importer),
                function("load", "m", "load"),
                call("v", "load", value),
                give("v", "v"),
            ]
        )
        assert result.finished.status == "COMPLETED", result.error
        assert result.value("v")["value"] == value
        workspaces.append(str(result.workspace))
    state = _probe(worker, workspaces[-1])
    assert state["helper"] is False
    assert state["importers"] == []


@pytest.mark.parametrize(
    ("seconds", "spacing"),
    [
        (0.0, FULL_COLLECTION_EVERY),  # cheap: as often as before
        (0.001, FULL_COLLECTION_EVERY),
        (0.010, 400),  # ~25 us per program
        (0.040, 1600),
        (0.080, FULL_COLLECTION_MAX_SPACING),  # a torch worker on a loaded machine
        (10.0, FULL_COLLECTION_MAX_SPACING),
    ],
)
def test_a_dearer_full_collection_comes_less_often_within_bounds(seconds, spacing):
    assert full_collection_spacing(seconds) == spacing
