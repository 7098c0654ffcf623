"""Fork servers that preload torch (SERVER §1, ``--worker-preload``): fresh workers start
with torch imported, the launcher forks only single-threaded and without CUDA, and one that
breaks that rule refuses to fork and says why.

The test session turns the preload off (tests/conftest.py); these tests turn it on.
"""

from __future__ import annotations

import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from kcoral_server.processes import sandbox
from kcoral_server.processes.launcher.fork_server import PRELOAD_IDLE_SECONDS
from kcoral_server.processes.launcher.front_end import ForkedProcess, Launcher, LauncherRefused
from kcoral_server.processes.sandbox import worker_base_environment
from server_process import RunningServer, start_server
from test_huge_pages import fold_problem

import kcoral

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("torch") is None or importlib.util.find_spec("numpy") is None,
    reason="torch and numpy are not installed: there is nothing to preload",
)

BWRAP_PROBLEM = sandbox.probe()
SANDBOXES = [
    pytest.param("none", id="unsandboxed"),
    pytest.param(
        "auto",
        id="default-sandbox",
        marks=pytest.mark.skipif(
            BWRAP_PROBLEM is not None, reason=f"bubblewrap cannot run here: {BWRAP_PROBLEM}"
        ),
    ),
]
#: forks tried until one comes from the preloaded launcher (the first ones may not)
FORK_TRIES = 200
#: how long a busy server may take to come preloaded: its launcher preloads 2 s after it
#: started at the latest, and importing torch takes seconds; back-to-back programs run
#: ~50 a second meanwhile, so a count of tries would not do
PRELOAD_WAIT_SECONDS = 60.0


# ---------------------------------------------------------------- the launcher itself


@pytest.fixture
def preloading_launcher() -> Iterator[Launcher]:
    launcher = Launcher(preload=("torch",))
    yield launcher
    launcher.close()


def _fork(launcher: Launcher, launcher_env: dict[str, str] | None = None) -> ForkedProcess:
    """A worker that exits as soon as it reads EOF on its channel (closed here at once)."""
    parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        return launcher.launch(child.fileno(), dict(os.environ), launcher_env=launcher_env)
    finally:
        child.close()
        parent.close()


def test_a_spares_fork_waits_for_the_preload_and_an_awaited_one_does_not() -> None:
    # A fresh launcher forks a worker a program waits for at once, without torch (the
    # server is ready as fast as without the preload); a spare's fork (no program waits
    # for it) comes after the preload, so its first program does not import torch itself.
    for after_preload, expected in ((False, ()), (True, ("torch",))):
        launcher = Launcher(preload=("torch",))
        try:
            parent, child = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                process = launcher.launch(
                    child.fileno(), dict(os.environ), after_preload=after_preload
                )
            finally:
                child.close()
                parent.close()
            assert process.preloaded == expected
            assert process.wait(60) == 0
        finally:
            launcher.close()


def _fork_after_the_preload(launcher: Launcher) -> ForkedProcess:
    """Fork until a worker comes from the preloaded launcher: the launcher imports torch
    once it has had no request for ``PRELOAD_IDLE_SECONDS``."""
    for _ in range(FORK_TRIES):
        process = _fork(launcher)
        if process.preloaded:
            return process
        process.wait(60)
        time.sleep(PRELOAD_IDLE_SECONDS * 2)  # leave the launcher idle long enough
    raise AssertionError(f"no worker came from a preloaded launcher in {FORK_TRIES} forks")


def _script_output(source: str) -> str:
    """What ``python -c source`` prints, run with a worker's environment."""
    found = subprocess.run(
        [sys.executable, "-c", source],
        env=worker_base_environment(os.environ),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    return found.stdout


def _mapped(pid: int, fragment: str) -> bool:
    return fragment in Path(f"/proc/{pid}/maps").read_text()


def test_a_worker_forked_after_the_preload_has_torch_loaded_before_it_runs_anything(
    preloading_launcher,
):
    process = _fork_after_the_preload(preloading_launcher)
    assert process.preloaded == ("torch",)
    # the worker has read nothing yet (its channel's EOF at most): torch came with the fork
    assert _mapped(process.pid, "libtorch")
    assert process.wait(60) == 0


def test_the_preloading_launcher_runs_no_thread_but_its_main_one(preloading_launcher):
    process = _fork_after_the_preload(preloading_launcher)
    process.wait(60)
    assert preloading_launcher._process is not None
    launcher_pid = preloading_launcher._process.pid
    assert _mapped(launcher_pid, "openblas")  # numpy's BLAS is loaded, its pool stopped
    assert os.listdir(f"/proc/{launcher_pid}/task") == [str(launcher_pid)]


def _anonymous_huge_kib(pid: int) -> int:
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1])
    return 0


@pytest.mark.skipif(fold_problem() is not None, reason=str(fold_problem()))
def test_the_preloading_launchers_heap_is_on_huge_pages(preloading_launcher):
    process = _fork_after_the_preload(preloading_launcher)
    process.wait(60)
    assert preloading_launcher._process is not None
    # torch's and numpy's heap, folded after the preload: each fork copies ~60 entries
    # for it instead of ~37,000 (launcher.huge_pages)
    assert _anonymous_huge_kib(preloading_launcher._process.pid) >= 32 << 10


PRELOAD_AND_LOOK = """
import json, os, sys, threading
from kcoral_server.processes.launcher.fork_server import fork_hazards, preload
loaded = preload(["torch"])
import torch
print(json.dumps({
    "loaded": loaded,
    "numpy": "numpy" in sys.modules,
    "cuda_initialized": torch.cuda.is_initialized(),
    "python_threads": len(threading.enumerate()),
    "native_threads": len(os.listdir("/proc/self/task")),
    "hazards": fork_hazards(),
}))
"""


def test_after_the_preload_cuda_is_not_initialized_and_the_process_is_single_threaded():
    state = json.loads(_script_output(PRELOAD_AND_LOOK))
    assert state == {
        "loaded": ["torch"],
        "numpy": True,
        "cuda_initialized": False,
        "python_threads": 1,
        "native_threads": 1,
        "hazards": [],
    }


@pytest.mark.parametrize(
    "arguments",
    [
        ["--fd", "3", "--preload", "numpy"],
        ["--fd", "3", "--preload", ""],
        ["--fd", "3", "--preload", "torch", "--preload", "torch"],
        ["--fd", "x"],
        ["--preload", "torch"],
    ],
    ids=["unknown-module", "empty-list", "repeated", "bad-fd", "no-fd"],
)
def test_the_launcher_answers_bad_arguments_with_its_usage(arguments: list[str]):
    found = subprocess.run(
        [sys.executable, "-m", "kcoral_server.processes.launcher", *arguments],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert found.returncode == 2
    assert found.stderr.startswith("usage: python -m kcoral_server.processes.launcher --fd N")


def test_a_launcher_cannot_be_asked_to_preload_an_unknown_module():
    with pytest.raises(ValueError, match="cannot preload numpy"):
        Launcher(preload=("numpy",))


FINALIZERS_AT_EXIT = """
import os, weakref
from kcoral_server.processes.launcher.fork_server import preload
from kcoral_server.processes.launcher.forked_worker import quick_exit as _quick_exit
from kcoral_server.worker.main import run_exit_handlers
preload(["torch"])
read, write = os.pipe()
pid = os.fork()
if pid == 0:  # like a worker: a program's finalizer, then the worker's exit handlers and quick exit
    class Kept:
        pass
    kept = Kept()
    weakref.finalize(kept, os.write, write, b"program finalizer ran")
    run_exit_handlers()
    _quick_exit(0)
os.close(write)
print(os.read(read, 100).decode())
print(sum(1 for finalizer in weakref.finalize._registry if finalizer.atexit))
"""


def test_a_preloaded_worker_skips_the_preloads_finalizers_at_exit_but_runs_its_own():
    """torch registers ~130 finalizers that only tidy its own registries: run at every
    worker's exit they cost tens of milliseconds a transient worker's next request waits
    for."""
    assert _script_output(FINALIZERS_AT_EXIT).splitlines() == ["program finalizer ran", "0"]


# ---------------------------------------------------------------- refusals

INTRUDERS = {
    "python-thread": (
        "import threading, time\n"
        "threading.Thread(target=time.sleep, args=(3600,), name='intruder', daemon=True).start()\n",
        "Python thread(s) besides the main one: intruder",
    ),
    "native-thread": (
        # a thread the threading module does not know about: /proc still counts it
        "import _thread, time\n_thread.start_new_thread(time.sleep, (3600,))\n",
        "native thread(s) besides the main one",
    ),
    "cuda-initialized": (
        "import sys, types\n"
        "fake = types.ModuleType('torch')\n"
        "fake.cuda = types.SimpleNamespace(is_initialized=lambda: True)\n"
        "sys.modules['torch'] = fake\n",
        "CUDA is initialized",
    ),
}


@pytest.mark.parametrize("intruder", sorted(INTRUDERS))
def test_a_launcher_that_breaks_the_fork_rule_refuses_to_fork_and_says_why(
    tmp_path: Path, intruder: str
):
    """``sitecustomize`` (imported at every interpreter start) breaks the rule in the
    launcher before it serves anything."""
    source, reason = INTRUDERS[intruder]
    (tmp_path / "sitecustomize.py").write_text(source)
    launcher_env = worker_base_environment(os.environ)
    launcher_env["PYTHONPATH"] = str(tmp_path)
    launcher = Launcher()
    try:
        with pytest.raises(LauncherRefused) as refused:
            _fork(launcher, launcher_env)
        assert "refused to fork" in str(refused.value)
        assert reason in str(refused.value)
        assert "--worker-preload none" in str(refused.value)
        with pytest.raises(LauncherRefused):  # and it goes on refusing
            _fork(launcher, launcher_env)
    finally:
        launcher.close()


def test_a_refusal_reaches_the_event_log_of_a_server_whose_launcher_runs_a_thread(
    tmp_path: Path,
):
    """No worker starts, so neither does the server; the event log says why."""
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "sitecustomize.py").write_text(INTRUDERS["python-thread"][0])
    with pytest.raises(RuntimeError, match="server did not start"):
        start_server(
            tmp_path / "server",
            ["--worker-preload", "torch"],
            env={"PYTHONPATH": str(tmp_path / "site")},
        )
    events = [
        json.loads(line)
        for path in (tmp_path / "server" / "logs").glob("runs/*/events.jsonl")
        for line in path.read_text().splitlines()
        if line.strip()
    ]
    failures = [event for event in events if event.get("event") == "worker_failed"]
    assert failures
    assert all("refused to fork" in event["error"] for event in failures)
    assert all("intruder" in event["error"] for event in failures)


# ---------------------------------------------------------------- through a server

SEES_TORCH = "import sys\nPRELOADED = 'torch' in sys.modules\ndef seen():\n    return PRELOADED\n"

MATMULS = """
import numpy as np
import torch
def multiply(seed):
    rng = np.random.default_rng(seed)
    a = rng.random((256, 256))
    b = a @ a.T + 256 * np.eye(256)
    inverse = np.linalg.inv(b)
    t = torch.from_numpy(a)
    product = t @ t.T
    return [float(np.trace(b @ inverse)), float(product.trace()), float(torch.ones(4).sum())]
"""


def _call(client: kcoral.Client, source: str, name: str, args: list | None = None):
    program = kcoral.Program()
    module = program.upload(kind="module", source=source, id="m")
    function = program.get_function(module=module, name=name, id="f")
    program.return_(key="out", value=program.run(fn=function, args=args or [], id="out"))
    return client.execute(program)["out"]


def preloading_server(folder: Path, sandbox_flag: str) -> RunningServer:
    """A server preloading torch, giving every request a fresh, forked worker."""
    return start_server(
        folder,
        ["--sandbox", sandbox_flag, "--worker-preload", "torch", "--max-requests-per-worker", "1"],
    )


@pytest.fixture(scope="module", params=SANDBOXES)
def fresh_worker_server(
    request, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    """A preloading server, sandbox as parametrized."""
    server = preloading_server(tmp_path_factory.mktemp("preloading-server"), request.param)
    yield server
    server.stop()


@pytest.mark.timeout(600)
def test_fresh_workers_see_torch_imported_when_their_first_line_runs_and_matmuls_work(
    fresh_worker_server,
):
    with kcoral.Client(fresh_worker_server.url) as client:
        seen = []
        # The pool's first workers were forked before the preload. A sandboxed seat
        # alternates between two directories, each with its own fork server preloading on
        # its own, and forks workers ahead in fork order: once two workers in a row (one
        # from each) came preloaded, every later one does.
        deadline = time.monotonic() + PRELOAD_WAIT_SECONDS
        while seen[-2:] != [True, True]:
            seen.append(_call(client, SEES_TORCH, "seen"))
            assert time.monotonic() < deadline, (
                f"no two fresh workers in a row came with torch imported in {len(seen)} programs"
            )
        for _ in range(3):
            assert _call(client, SEES_TORCH, "seen") is True
        # numpy's and torch's thread pools start afresh in every forked worker: no hang
        for seed in range(6):
            identity, trace, ones = _call(client, MATMULS, "multiply", [seed])
            assert identity == pytest.approx(256.0)
            assert trace > 0
            assert ones == 4.0


@pytest.mark.parametrize("sandbox_flag", SANDBOXES)
def test_every_program_after_a_servers_first_finds_torch_imported_in_its_fresh_worker(
    sandbox_flag: str, tmp_path: Path
):
    # The notebook's path: the first cells after the server started. Before, the seat's
    # first worker, its spare and the worker forked after it all came before the preload
    # and each imported torch at its first program: the first three cells took seconds.
    server = preloading_server(tmp_path / "server", sandbox_flag)
    try:
        with kcoral.Client(server.url) as client:
            seen = [_call(client, SEES_TORCH, "seen") for _ in range(4)]
    finally:
        server.stop()
    # the first is forked at once, so that the server is ready as fast as without it
    assert seen[1:] == [True, True, True], seen


@pytest.mark.parametrize("sandbox_flag", SANDBOXES)
def test_a_first_cell_that_comes_after_the_preload_finds_torch_imported(
    sandbox_flag: str, tmp_path: Path
):
    # A person's first cell comes seconds after the server is ready. The seat's first
    # worker was forked before the preload; once the spare forked after it is ready, the
    # idle first worker gives way to it, and that first cell need not import torch.
    server = preloading_server(tmp_path / "server", sandbox_flag)
    try:
        deadline = time.monotonic() + PRELOAD_WAIT_SECONDS
        while not [e for e in server.events() if e.get("reason") == "preload"]:
            assert time.monotonic() < deadline, "the first worker never gave way to its spare"
            time.sleep(0.1)
        with kcoral.Client(server.url) as client:
            seen = [_call(client, SEES_TORCH, "seen") for _ in range(3)]
        retired = [e for e in server.events() if e["event"] == "worker_retired"]
    finally:
        server.stop()
    assert seen == [True, True, True]
    assert (retired[0]["reason"], retired[0]["level"]) == ("preload", "INFO")


def test_without_the_preload_a_fresh_worker_imports_torch_itself(tmp_path: Path):
    server = start_server(
        tmp_path / "server",
        ["--worker-preload", "none", "--max-requests-per-worker", "1"],
    )
    try:
        with kcoral.Client(server.url) as client:
            assert [_call(client, SEES_TORCH, "seen") for _ in range(3)] == [False] * 3
    finally:
        server.stop()


EXIT_WALK = """
import os, sys, weakref
from kcoral_server.processes.progress_slot import ProgressSlot
from kcoral_server.processes.launcher.fork_server import preload
from kcoral_server.processes.launcher.forked_worker import quick_exit as _quick_exit
from kcoral_server.worker.main import run_exit_handlers
preload(["torch"])
walk = weakref.finalize._select_for_exit
def counted_walk():
    os.write(1, b"walked ")
    return walk()
weakref.finalize._select_for_exit = counted_walk
for make_one in (False, True):
    pid = os.fork()
    if pid == 0:  # like a one-shot worker: a progress slot, maybe a finalizer of its own
        slot, fd = ProgressSlot.create()
        if make_one:
            class Kept:
                pass
            kept = Kept()
            weakref.finalize(kept, os.write, 1, b"program finalizer ran")
        run_exit_handlers()
        _quick_exit(0)
    os.waitpid(pid, 0)
    os.write(1, b"|")
"""


def test_a_forked_worker_walks_no_finalizer_at_exit_unless_it_made_one() -> None:
    """Walking the preload's ~130 finalizers copies ~150 pages shared with the launcher,
    which a one-shot worker's exit report waits for (issue 31): the walk is left out when
    nothing made after the fork is due at exit, and still runs the program's own."""
    no_finalizer, own_finalizer, _ = _script_output(EXIT_WALK).split("|")
    assert no_finalizer == ""
    assert own_finalizer.startswith("walked ")
    assert "program finalizer ran" in own_finalizer
