"""When a sandboxed worker empties its workspace (SERVER §14, issue 31): a reused one after
the answer went out and before it says ready again; a one-shot one never (its seat's next
worker starts in a workspace the front-end emptied); one whose workspace will not empty
retires with ``sandbox_cleanup`` instead of taking another program.

The worker runs outside bubblewrap here (``Configure.sandbox`` alone decides its clean-up),
with the harness's per-program directory as its workspace; the real sandbox is in
``tests/sandbox``."""

from __future__ import annotations

from pathlib import Path

from kcoral_server.processes import ipc
from kcoral_server.processes.sandbox import STATE_DIRS
from worker_harness import module

LITTER = (
    "import os\n"
    "open('left.txt', 'w').write('x')\n"
    "os.makedirs('tree/deeper')\n"
    "open('tree/deeper/f', 'w').write('y')\n"
    "os.symlink('/etc', 'link')\n"
    "os.makedirs('.kcoral/tmp', exist_ok=True)\n"
    "os.makedirs('.kcoral/cache', exist_ok=True)\n"
    "open('.kcoral/tmp/scratch', 'w').write('z')\n"
    "open('.kcoral/cache/kept', 'w').write('kept')\n"
    "open('.kcoral/home', 'w').write('a file where a directory belongs')\n"
)


def _names(root: Path) -> set[str]:
    return {str(path.relative_to(root)) for path in root.rglob("*")}


def test_a_reused_sandboxed_worker_empties_its_workspace_after_the_answer(start_worker):
    worker = start_worker(sandbox="bubblewrap")
    result = worker.run([module("m", LITTER)])
    assert result.finished.status == "COMPLETED", result.error
    assert result.ready_again  # it emptied the workspace before it said ready
    state = result.workspace / ".kcoral"
    assert {p for p in _names(result.workspace) if not p.startswith(".kcoral")} == set()
    assert sorted(p.name for p in state.iterdir()) == sorted(STATE_DIRS)
    assert all((state / name).is_dir() and not (state / name).is_symlink() for name in STATE_DIRS)
    assert list((state / "tmp").iterdir()) == []  # scratch goes
    assert (state / "cache" / "kept").read_text() == "kept"  # caches stay for reuse


def test_a_one_shot_sandboxed_worker_leaves_its_workspace_to_the_front_end(start_worker):
    worker = start_worker(sandbox="bubblewrap", transient=True)
    result = worker.run([module("m", LITTER)])
    assert result.finished.status == "COMPLETED", result.error
    assert worker.proc.wait(timeout=30) == 0
    # SeatSandbox.launch empties it before the seat's next worker starts there
    assert (result.workspace / "left.txt").exists()


def test_a_worker_whose_workspace_will_not_empty_retires_instead_of_saying_ready(start_worker):
    worker = start_worker(sandbox="bubblewrap")
    gone = "import os\nhere = os.getcwd()\nos.chdir('/')\nos.rmdir(here)\n"
    result = worker.run([module("m", gone)], expect_ready=False)
    assert result.finished.status == "COMPLETED", result.error
    message, _fds = worker.receive()
    assert message == ipc.WorkerRetiring(reason=ipc.SANDBOX_CLEANUP)
    assert worker.proc.wait(timeout=30) == 0


def test_a_worker_without_a_sandbox_leaves_the_workspace_to_the_front_end(start_worker):
    worker = start_worker()
    result = worker.run([module("m", "open('left.txt', 'w').write('x')\n")])
    assert result.ready_again
    assert (result.workspace / "left.txt").exists()  # the front-end deletes the whole directory
