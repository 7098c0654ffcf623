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


GC_PROBE = (
    "import gc, sys, types\n"
    "def install():\n"
    # a module the program leaves behind, as `import torch` in a session's first cell does
    "    probe = types.ModuleType('kcoral_gc_probe')\n"
    "    probe.seen = []\n"
    "    probe.state = [[i] for i in range(50000)]\n"  # long-lived objects it made
    "    gc.callbacks.append(lambda phase, info: phase == 'start'\n"
    "                        and probe.seen.append(info['generation']))\n"
    "    sys.modules['kcoral_gc_probe'] = probe\n"
    "    return []\n"
    "def seen():\n"
    "    probe = sys.modules['kcoral_gc_probe']\n"
    "    found, probe.seen[:] = list(probe.seen), []\n"
    "    return found\n"
)


def _gc_probe(worker, name: str) -> list:
    result = worker.run(
        [
            module("g", GC_PROBE),
            function(name, "g", name),
            call("r", name),
            give("r", "r"),
        ]
    )
    assert result.finished.status == "COMPLETED", result.error
    value = result.value("r")["value"]
    return [item["value"] for item in value] if isinstance(value, list) else value


def test_after_a_program_that_left_modules_behind_the_worker_does_not_traverse_them(
    start_worker,
):
    # A session's second cell waited for the clean-up of the first, which had imported
    # torch: a full collection of every new object (~0.8 s) before the worker was ready
    # (issue 29.9). After such a program only the young generations are collected.
    worker = start_worker()
    _gc_probe(worker, "install")
    after_import = _gc_probe(worker, "seen")  # the clean-up after `install` ran meanwhile
    assert after_import and max(after_import) == 1, after_import
    # A program that imported nothing is followed by the whole collection, as before.
    after_plain = _gc_probe(worker, "seen")
    assert 2 in after_plain, after_plain


def test_the_clean_up_after_a_first_import_of_torch_sets_only_what_changed(start_worker):
    # It used to reset every torch setting to torch's defaults, and the first call of
    # torch.use_deterministic_algorithms imports torch._inductor.config (sympy, ~800
    # modules, seconds): a session's next cell waited for it (issue 29.9).
    pytest.importorskip("torch", reason="the torch settings clean-up needs torch")
    worker = start_worker()
    importer = (
        "import sys\ndef load():\n    import torch\n"
        "    return 'torch._inductor.config' in sys.modules\n"
    )
    probe = "import sys\ndef seen():\n    return 'torch._inductor.config' in sys.modules\n"
    for source, name, expected in ((importer, "load", False), (probe, "seen", False)):
        result = worker.run(
            [module("m", source), function(name, "m", name), call("r", name), give("r", "r")]
        )
        assert result.finished.status == "COMPLETED", result.error
        assert result.value("r")["value"] is expected
    # a setting a program did change is still put back
    changer = "import torch\ndef change():\n    torch.set_grad_enabled(False)\n    return True\n"
    reader = "import torch\ndef read():\n    return torch.is_grad_enabled()\n"
    for source, name, expected in ((changer, "change", True), (reader, "read", True)):
        result = worker.run(
            [module("m", source), function(name, "m", name), call("r", name), give("r", "r")]
        )
        assert result.finished.status == "COMPLETED", result.error
        assert result.value("r")["value"] is expected
