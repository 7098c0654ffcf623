"""Worker process lifecycle: leases, teardown, reuse, leftover processes, exit."""

from __future__ import annotations

import os

import pytest
from worker_harness import blob, call, function, give, give_path, launch, module, ref

LEFTOVER = "program left background processes running; they were terminated"

SPAWNERS = (
    "import os, subprocess, time\n"
    "def child():\n"
    "    return subprocess.Popen(['sleep', '1000']).pid\n"
    "def daemon():\n"
    "    read, write = os.pipe()\n"
    "    if os.fork() == 0:\n"
    "        os.setsid()\n"
    "        if os.fork() == 0:\n"
    "            os.write(write, str(os.getpid()).encode())\n"
    "            time.sleep(1000)\n"
    "        os._exit(0)\n"
    "    os.close(write)\n"
    "    pid = int(os.read(read, 64))\n"
    "    os.close(read)\n"
    "    return pid\n"
    "def finished():\n"
    "    return subprocess.Popen(['true']).pid\n"  # exits at once and is never waited for
    "def settle(pid):\n"
    "    for _ in range(500):\n"
    "        try:\n"
    "            with open(f'/proc/{pid}/stat') as f:\n"
    "                if f.read().rsplit(')', 1)[1].split()[0] == 'Z':\n"
    "                    return pid\n"
    "        except FileNotFoundError:\n"
    "            return pid\n"
    "        time.sleep(0.01)\n"
    "    return pid\n"
    "def fail():\n    raise ValueError('first')\n"
)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.parametrize("spawner", ["child", "daemon"])
def test_leftover_background_processes_are_killed_and_fail_the_program(start_worker, spawner):
    worker = start_worker()
    result = worker.run(
        [
            module("m", SPAWNERS),
            function("spawn", "m", spawner),
            call("pid", "spawn"),
            give("pid", "pid"),
        ]
    )
    pid = result.value("pid")["value"]
    assert result.finished.left_processes is True
    assert result.finished.status == "FAILED"
    assert result.error == {
        "kind": "runtime",
        "message": LEFTOVER,
        "instruction_index": 3,
        "instruction_op": "return",
        "instruction_id": None,
        "traceback": "",
    }
    assert not _alive(pid)


def test_a_failed_program_keeps_its_own_error_when_processes_are_left(start_worker):
    worker = start_worker()
    result = worker.run(
        [
            module("m", SPAWNERS),
            function("spawn", "m", "child"),
            function("fail", "m", "fail"),
            call("pid", "spawn"),
            call("boom", "fail"),
        ]
    )
    assert result.finished.left_processes is True
    assert result.error["message"] == "ValueError: first"
    assert result.error["instruction_index"] == 4


def test_a_child_that_already_finished_is_not_a_leftover(start_worker):
    worker = start_worker()
    result = worker.run(
        [
            module("m", SPAWNERS),
            function("finished", "m", "finished"),
            function("settle", "m", "settle"),
            call("pid", "finished"),
            call("settled", "settle", ref("pid")),
        ]
    )
    assert result.finished.status == "COMPLETED", result.error
    assert result.finished.left_processes is False


def test_a_cpu_worker_never_sends_lease_messages(start_worker):
    worker = start_worker()
    assert [m.tag for m in worker.startup] == ["worker_ready"]
    assert worker.ready.target == {}
    result = worker.run([module("m", "X = 1\n"), function("x", "m", "X"), give("x", "x")])
    assert not {"lease_acquire", "lease_release"} & set(result.trace())
    assert result.finished.lease_held is False


def test_a_fake_gpu_worker_leases_per_instruction_placement(start_worker):
    worker = start_worker("fake-gpu", gpu_uuids=("GPU-test",))
    assert [m.tag for m in worker.startup] == ["lease_acquire", "lease_release", "worker_ready"]
    assert worker.ready.target == {"arch": "sm_90a"}
    assert worker.ready.device_uuid == "GPU-test"
    sha, data = blob(b"payload")
    source = (
        "def ident(x):\n    return x\ndef size(path):\n    return len(open(path, 'rb').read())\n"
    )
    result = worker.run(
        [
            module("m", source),  # 0 acquire
            function("ident", "m", "ident"),  # 1 held
            function("size", "m", "size", cpu_only=True),  # 2 held
            {"op": "upload", "kind": "file", "id": "p", "path": "in", "blob": sha},  # 3 release
            {"op": "upload", "kind": "bytes", "id": "b", "blob": sha},  # 4 nothing
            call("n", "size", ref("p")),  # 5 cpu_only: stays released
            call("x", "ident", 5),  # 6 acquire
            module("cu", "__global__ void k() {}", language="cuda"),  # 7 nothing
            give_path("f", "file", "in"),  # 8 release
            give("x", "x"),  # 9 acquire
        ],
        [(sha, data)],
    )
    assert result.finished.status == "COMPLETED", result.error
    assert result.trace() == [
        "start:0",
        "lease_acquire",
        "start:1",
        "start:2",
        "start:3",
        "lease_release",
        "start:4",
        "start:5",
        "start:6",
        "lease_acquire",
        "start:7",
        "start:8",
        "lease_release",
        "return_produced",
        "start:9",
        "lease_acquire",
        "return_produced",
        "program_finished",
    ]
    assert result.finished.lease_held is True


def test_fake_gpu_teardown_reacquires_the_lease(start_worker):
    worker = start_worker("fake-gpu")
    source = "def noop():\n    return None\n"
    result = worker.run(
        [module("m", source), function("f", "m", "noop", cpu_only=True), call("r", "f")]
    )
    assert result.trace() == [
        "start:0",
        "lease_acquire",
        "start:1",
        "start:2",
        "lease_release",
        "lease_acquire",
        "program_finished",
    ]
    assert result.finished.lease_held is True


def test_get_function_on_a_non_module_handle_is_a_runtime_error_on_a_gpu_worker(start_worker):
    worker = start_worker("fake-gpu")
    sha, data = blob(b"abc")
    result = worker.run(
        [{"op": "upload", "kind": "bytes", "id": "b", "blob": sha}, function("f", "b", "x")],
        [(sha, data)],
    )
    assert result.error["kind"] == "runtime"
    assert result.error["message"] == "get_function expects an uploaded module or library handle"


def test_a_reused_worker_restores_its_state_between_programs(start_worker):
    worker = start_worker()
    source = (
        "import ctypes, linecache, os, sys\n"
        "os.environ['KCORAL_TEST_PY'] = 'set'\n"
        "ctypes.CDLL(None).setenv(b'KCORAL_TEST_NATIVE', b'set', 1)\n"
        "os.environ.pop('HOME', None)\n"
        "sys.path.insert(0, '/nowhere')\n"
        "os.makedirs('pkg')\n"
        "open('pkg/helper_mod.py', 'w').write('VALUE = 1\\n')\n"
        "sys.path.insert(0, os.getcwd() + '/pkg')\n"
        "import helper_mod\n"
        "os.chdir('pkg')\n"
    )
    probe = (
        "import linecache, os, sys\n"
        "def state():\n"
        "    with os.popen('echo ${KCORAL_TEST_NATIVE:-unset}') as shell:\n"  # close() waits for it
        "        native = shell.read().strip()\n"
        "    return {\n"
        "        'py': os.environ.get('KCORAL_TEST_PY', 'unset'),\n"
        "        'native': native,\n"
        "        'home': 'HOME' in os.environ,\n"
        "        'path': '/nowhere' in sys.path,\n"
        "        'helper': 'helper_mod' in sys.modules,\n"
        "        'uploads': sorted(m for m in sys.modules if m.startswith('kcoral_uploaded_')),\n"
        "        'lines': sorted(k for k in linecache.cache if k.startswith('<uploaded:')),\n"
        "        'cwd': os.getcwd(),\n"
        "    }\n"
    )
    changed = worker.run([module("m", source)])
    assert changed.finished.status == "COMPLETED", changed.error
    assert os.readlink(f"/proc/{worker.proc.pid}/cwd") == str(worker.tmp)
    env_probe = worker.run(
        [
            module("p", probe),
            function("state", "p", "state"),
            call("s", "state"),
            give("s", "s"),
        ]
    )
    assert env_probe.finished.status == "COMPLETED", env_probe.error
    state = {k: v["value"] for k, v in env_probe.value("s")["value"].items()}
    assert state["py"] == "unset"
    assert state["native"] == "unset"
    assert state["home"] == ("HOME" in os.environ)
    assert state["path"] is False
    assert state["helper"] is False
    assert len(state["uploads"]) == 1  # only the probe module of this very program
    assert len(state["lines"]) == 1
    assert state["cwd"] == str(env_probe.workspace)


def test_the_worker_exits_when_the_channel_closes(tmp_path):
    worker = launch(tmp_path)
    assert worker.ready is not None
    worker.channel.sock.close()
    assert worker.proc.wait(timeout=30) == 0


def test_the_worker_exits_cleanly_on_shutdown(tmp_path):
    worker = launch(tmp_path)
    try:
        assert worker.shutdown() == 0
    finally:
        worker.kill()


def test_a_transient_worker_exits_after_one_program(tmp_path):
    worker = launch(tmp_path, transient=True)
    try:
        result = worker.run([module("m", "X = 1\n")])
        assert result.finished.status == "COMPLETED"
        assert worker.proc.wait(timeout=30) == 0
    finally:
        worker.kill()


def test_a_worker_that_cannot_start_reports_why_and_exits_1(tmp_path):
    worker = launch(tmp_path, "no-such-device")
    try:
        assert worker.failed is not None
        assert "no-such-device" in worker.failed.error
        assert worker.proc.wait(timeout=30) == 1
    finally:
        worker.kill()


@pytest.mark.slow  # imports torch
def test_a_gpu_worker_without_cuda_fails_to_start_and_gives_the_lease_back(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip(
            "this machine has CUDA, so a GPU worker starts here: real starts are "
            "tests/gpu/test_gpu_server.py (pytest -m gpu)"
        )
    worker = launch(tmp_path, "gpu", gpu_uuids=("GPU-none",))
    try:
        assert worker.failed is not None
        assert "CUDA" in worker.failed.error  # tvm_ffi and cupti-python are optional now
        tags = [m.tag for m in worker.startup]
        assert tags.count("lease_acquire") == tags.count("lease_release")
        assert worker.proc.wait(timeout=30) == 1
    finally:
        worker.kill()
