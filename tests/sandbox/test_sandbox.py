"""The bubblewrap sandbox (SERVER.md §14): probe and fallback, command line, isolation."""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest
from kcoral_server.processes import sandbox
from kcoral_server.processes.sandbox import SandboxDir, SandboxError
from kcoral_server.storage import workspace
from sandbox_helpers import execute, run_source, sha256
from server_process import start_server

BWRAP_PROBLEM = sandbox.probe()
needs_bwrap = pytest.mark.skipif(
    BWRAP_PROBLEM is not None, reason=f"bubblewrap cannot run here: {BWRAP_PROBLEM}"
)


def sandboxed_server(directory: Path, *args: str, env: dict[str, str] | None = None):
    return start_server(directory, ["--sandbox", "bubblewrap", *args], env=env)


# ---------------------------------------------------------------- units


def test_a_readonly_path_that_is_root_or_an_ancestor_of_the_workspace_root_is_refused(
    tmp_path: Path,
) -> None:
    root = tmp_path / "a" / "b"
    root.mkdir(parents=True)
    for refused in (Path("/"), tmp_path, tmp_path / "a", root):
        with pytest.raises(SandboxError, match="ancestor of the sandbox workspace root"):
            sandbox.check_readonly_paths([refused], root)
    other = Path(__file__).parent
    assert sandbox.check_readonly_paths([other], root) == [other.resolve()]


def test_a_readonly_path_under_dev_shm_is_refused_and_one_under_tmp_is_not(tmp_path) -> None:
    for refused in (Path("/dev/shm"), Path("/dev/shm/x")):
        with pytest.raises(SandboxError, match="private to each sandbox"):
            sandbox.check_readonly_paths([refused], tmp_path / "root")
    # a checkout under /tmp is bound into a private tmpfs (SandboxDir.command)
    assert sandbox.check_readonly_paths([Path("/tmp/x")], tmp_path / "root") == [Path("/tmp/x")]


def test_the_workspace_is_mounted_at_work_unless_that_shadows_a_readonly_path() -> None:
    assert sandbox.choose_mount([Path("/usr"), Path("/opt/x")]) == "/work"
    assert sandbox.choose_mount([Path("/usr"), Path("/work/main")]) == "/workspace"
    assert sandbox.choose_mount([Path("/workspace/x"), Path("/work")]) == "/kcoral-work"


def test_the_probe_reports_a_missing_bwrap(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert sandbox.probe() == "bwrap was not found on PATH"


def test_a_failed_probe_logs_sandbox_disabled_and_warns(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    emitted = []

    class Events:
        def emit(self, event, level="INFO", **fields):
            emitted.append((event, level, fields))

    # issue 16: only --sandbox auto falls back; an explicit bubblewrap refuses
    with pytest.raises(sandbox.SandboxUnavailable, match="bwrap was not found"):
        sandbox.resolve_sandbox("bubblewrap", [], Events())
    assert emitted == []
    with pytest.warns(RuntimeWarning, match="bubblewrap sandbox is unusable"):
        assert sandbox.resolve_sandbox("auto", [], Events()) == "none"
    assert emitted == [
        (
            "sandbox_disabled",
            "WARNING",
            {
                "sandbox": "auto",
                "error": "bwrap was not found on PATH",
                "message": sandbox.DISABLED_MESSAGE,
            },
        )
    ]
    assert sandbox.resolve_sandbox("none", [], Events()) == "none"
    assert len(emitted) == 1


def test_every_kcoral_token_or_secret_and_every_denied_name_is_kept_from_workers() -> None:
    environ = {
        "KCORAL_AUTH_TOKEN": "a",
        "KCORAL_NODE_TOKEN": "n",
        "KCORAL_TOKEN": "t",
        "KCORAL_ROUTER_SECRET": "r",
        "KCORAL_CHILD_TOKEN_FILE": "c",
        "KCORAL_LOG_DIR": "keep",
        "AWS_SECRET_ACCESS_KEY": "denied",
        "CLOUD_A": "denied",
        "CLOUDY": "denied",
        "PATH": "/usr/bin",
    }
    kept = sandbox.worker_base_environment(environ, ["AWS_SECRET_ACCESS_KEY", "CLOUD*"])
    assert kept == {"KCORAL_LOG_DIR": "keep", "PATH": "/usr/bin"}


def test_a_token_file_inside_a_readonly_bind_is_covered(tmp_path: Path) -> None:
    token = tmp_path / "tokens"
    token.write_text("secret\n")
    outside = Path("/nonexistent-token-file")
    box = SandboxDir(
        readonly_paths=[tmp_path], bwrap="/opt/bwrap", environ={}, hidden_paths=[token, outside]
    )
    try:
        argv = box.command(["python"])
        assert ["--ro-bind", "/dev/null", str(token.resolve())] == argv[
            argv.index("/dev/null") - 1 : argv.index("/dev/null") + 2
        ]
        assert str(outside) not in argv
    finally:
        box.remove()


def test_a_server_directory_inside_a_readonly_bind_is_covered_by_an_empty_read_only_tmpfs(
    tmp_path: Path,
) -> None:
    logs = tmp_path / "logs"
    (logs / "runs").mkdir(parents=True)
    cache = logs / "cache"  # inside a covered directory: nothing more to do
    cache.mkdir()
    box = SandboxDir(
        readonly_paths=[tmp_path], bwrap="/opt/bwrap", environ={}, hidden_paths=[cache, logs]
    )
    try:
        argv = box.command(["python"])
        where = argv.index("--remount-ro")
        assert argv[where - 2 : where + 2] == ["--tmpfs", str(logs), "--remount-ro", str(logs)]
        assert where > argv.index(str(tmp_path.resolve()))  # after the bind it covers
        assert str(cache) not in argv
    finally:
        box.remove()


def test_the_bwrap_command_unshares_everything_and_binds_read_only(tmp_path: Path) -> None:
    extra = Path(__file__).parent
    box = SandboxDir(readonly_paths=[extra], bwrap="/opt/bwrap", environ={})
    try:
        argv = box.command(["python", "-m", "kcoral_server.worker", "--fd", "3"])
        assert argv[0] == "/opt/bwrap"
        assert "--unshare-all" in argv and "--die-with-parent" in argv
        assert argv[argv.index("--cap-drop") + 1] == "ALL"
        ro = {argv[i + 1] for i, a in enumerate(argv) if a == "--ro-bind"}
        # each path is bound itself or inside an outer bound directory
        for path in (extra, Path(sys.prefix), Path(sandbox.__file__).parent):
            assert any(path.resolve().is_relative_to(p) for p in ro), path
        binds = [(argv[i + 1], argv[i + 2]) for i, a in enumerate(argv) if a == "--bind"]
        assert (str(box.host_dir), box.mount) in binds
        assert argv[-6:] == ["--", "python", "-m", "kcoral_server.worker", "--fd", "3"]
        assert not any(a.startswith("/dev/nvidia") for a in argv)  # CPU worker: no GPU nodes
        for name in sandbox.STATE_DIRS:
            assert (box.host_dir / ".kcoral" / name).is_dir()
    finally:
        box.remove()
    assert not box.host_dir.exists()


def test_a_gpu_worker_gets_only_its_own_device_nodes(tmp_path: Path) -> None:
    box = SandboxDir(device="gpu", gpu_ids=[3], bwrap="/opt/bwrap", environ={})
    try:
        argv = box.command(["worker"])
        nodes = {argv[i + 1] for i, a in enumerate(argv) if a == "--dev-bind-try"}
        assert "/dev/nvidia3" in nodes and "/dev/nvidiactl" in nodes
        assert not any(
            n.startswith("/dev/nvidia") and n[11:].isdigit() for n in nodes - {"/dev/nvidia3"}
        )
    finally:
        box.remove()


def test_the_sandbox_environment_points_state_into_the_workspace(tmp_path: Path) -> None:
    extra = Path(__file__).parent
    box = SandboxDir(readonly_paths=[extra], bwrap="/opt/bwrap", environ={})
    try:
        env = box.environment(
            {"KCORAL_AUTH_TOKEN": "secret", "KCORAL_NODE_TOKEN": "x", "KEEP": "1"}
        )
        m = box.mount
        assert env["HOME"] == f"{m}/.kcoral/home"
        for name in ("TMPDIR", "TMP", "TEMP"):
            assert env[name] == f"{m}/.kcoral/tmp"
        assert env["XDG_CACHE_HOME"] == f"{m}/.kcoral/cache"
        assert env["CUDA_CACHE_PATH"] == f"{m}/.kcoral/cuda"
        assert env["TRITON_CACHE_DIR"] == f"{m}/.kcoral/triton"
        assert env["TORCH_EXTENSIONS_DIR"] == f"{m}/.kcoral/extensions"
        assert env["TVM_FFI_CACHE_DIR"] == f"{m}/.kcoral/cache/tvm-ffi"
        assert env["PYTHONDONTWRITEBYTECODE"] == env["PYTHONNOUSERSITE"] == "1"
        assert env["PYTHONPATH"].split(os.pathsep)[0] == str(extra.resolve())
        assert "KCORAL_AUTH_TOKEN" not in env and "KCORAL_NODE_TOKEN" not in env
        assert env["KEEP"] == "1"
    finally:
        box.remove()


# ---------------------------------------------------------------- servers


def test_without_bwrap_the_server_falls_back_with_a_warning(tmp_path: Path) -> None:
    empty = tmp_path / "empty-path"
    empty.mkdir()
    # issue 16: only --sandbox auto (the default) falls back; explicit bubblewrap refuses
    server = start_server(tmp_path / "server", ["--sandbox", "auto"], env={"PATH": str(empty)})
    try:
        status, body, _ = execute(server.url, run_source("def main():\n    return 7\n"))
        assert status == 200 and body["status"] == "COMPLETED", body
        events = server.events()
        disabled = [e for e in events if e["event"] == "sandbox_disabled"]
        assert len(disabled) == 1 and disabled[0]["level"] == "WARNING"
        assert disabled[0]["error"] == "bwrap was not found on PATH"
        assert [e["sandbox"] for e in events if e["event"] == "pool_ready"] == ["none"]
        assert "RuntimeWarning" in server.stderr()
    finally:
        server.stop()


def test_a_readonly_path_above_the_workspace_root_stops_the_server(tmp_path: Path) -> None:
    root = sandbox.workspace_root()
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "kcoral",
            "server",
            "--port",
            "0",
            "--device",
            "cpu",
            "--sandbox-readonly-path",
            str(root),
            "--log-dir",
            "",
        ],
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert done.returncode != 0
    assert b"ancestor of the sandbox workspace root" in done.stderr


ISOLATION = """
import os, socket, sys

def main(secret, port):
    print("to stdout"); print("to stderr", file=sys.stderr)
    os.system("echo from a child process")
    found = {"secret": os.path.exists(secret), "cwd": os.getcwd()}
    try:
        with open(secret) as f:
            found["read"] = f.read()
    except OSError as exc:
        found["read"] = type(exc).__name__
    s = socket.socket()
    s.settimeout(5)
    try:
        s.connect(("127.0.0.1", port))
        found["network"] = "connected"
    except OSError as exc:
        found["network"] = type(exc).__name__
    finally:
        s.close()
    with open("made/out.txt", "w") as f:
        f.write("made inside")
    found["workspace"] = sorted(os.listdir("."))
    found["home"] = os.environ["HOME"]
    # /tmp links into the workspace, or is a private tmpfs when the install lives under /tmp
    found["tmp_is_private"] = (
        os.path.realpath("/tmp").endswith("/.kcoral/tmp") or os.path.ismount("/tmp")
    )
    return found
"""


@needs_bwrap
def test_a_sandboxed_worker_is_isolated_but_runs_programs_tensors_and_files(
    tmp_path: Path,
) -> None:
    secret = tmp_path / "host-secret.txt"
    secret.write_text("do not read")
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    readonly = Path(__file__).parent  # holds sandbox_helpers.py; outside /tmp
    server = sandboxed_server(tmp_path / "server", "--sandbox-readonly-path", str(readonly))
    try:
        data = struct.pack("<3f", 1.0, 2.0, 3.0)
        program = run_source(ISOLATION, args=[str(secret), port])
        program["instructions"][:0] = [
            {
                "op": "upload",
                "id": "in",
                "kind": "file",
                "path": "made/in.txt",
                "blob": sha256(b"upload"),
            },
            {
                "op": "upload",
                "id": "t",
                "kind": "tensor",
                "dtype": "float32",
                "shape": [3],
                "blob": sha256(data),
            },
        ]
        program["instructions"] += [
            {"op": "return", "key": "tensor", "value": {"$ref": "t"}},
            {"op": "return", "key": "file", "kind": "file", "path": "made/out.txt"},
            {"op": "return", "key": "folder", "kind": "folder", "path": "made"},
        ]
        blobs = {sha256(b"upload"): b"upload", sha256(data): data}
        status, body, parts = execute(server.url, program, blobs)
        assert status == 200 and body["status"] == "COMPLETED", body
        found = body["results"]["value"]["value"]
        assert found["secret"]["value"] is False
        assert found["read"]["value"] == "FileNotFoundError"
        assert found["network"]["value"] in ("ConnectionRefusedError", "OSError")
        assert found["tmp_is_private"]["value"] is True
        mount = found["cwd"]["value"]
        assert found["home"]["value"] == f"{mount}/.kcoral/home"
        assert [v["value"] for v in found["workspace"]["value"]] == [".kcoral", "made"]
        assert body["stdout"] == "to stdout\nfrom a child process\n"
        assert body["stderr"] == "to stderr\n"
        tensor = body["results"]["tensor"]
        assert tensor["dtype"] == "float32" and tensor["shape"] == [3]
        assert parts[tensor["part"]] == data
        assert parts[body["results"]["file"]["part"]] == b"made inside"
        assert sorted(body["results"]["folder"]["files"]) == ["in.txt", "out.txt"]

        # The workspace is cleared between requests; read-only paths are importable.
        second = run_source(
            "import os, sandbox_helpers\n"
            "def main():\n"
            "    return [sorted(os.listdir('.')), sandbox_helpers.sha256(b'')[:4]]\n"
        )
        status, body, _ = execute(server.url, second)
        assert body["status"] == "COMPLETED", body
        listing, value = body["results"]["value"]["value"]
        assert [v["value"] for v in listing["value"]] == [".kcoral"]
        assert value["value"] == "e3b0"

        # Nothing may be written to a read-only path.
        target = readonly / "must-not-exist.txt"
        write = run_source(f"def main():\n    open({str(target)!r}, 'w').write('no')\n")
        status, body, _ = execute(server.url, write)
        assert body["status"] == "FAILED" and body["error"]["kind"] == "runtime", body
        assert not target.exists()
    finally:
        server.stop()
        listener.close()
    assert [e["sandbox"] for e in server.events() if e["event"] == "pool_ready"] == ["bubblewrap"]


@needs_bwrap
def test_uploads_into_the_runtime_state_directory_fail(tmp_path: Path) -> None:
    server = sandboxed_server(tmp_path / "server")
    try:
        program = {
            "instructions": [
                {
                    "op": "upload",
                    "id": "u",
                    "kind": "file",
                    "path": ".kcoral/home/x",
                    "blob": sha256(b"x"),
                },
            ]
        }
        status, body, _ = execute(server.url, program, {sha256(b"x"): b"x"})
        assert status == 200 and body["status"] == "FAILED"
        assert body["error"]["kind"] == "runtime"
        assert body["error"]["instruction_index"] == 0
        assert body["error"]["message"] == (  # it said only 'is reserved in the sandbox'
            "path '.kcoral/home/x' is reserved: the sandbox keeps the worker's own files (its "
            "home, temporary files and caches) in .kcoral; upload it under another name"
        )
    finally:
        server.stop()


@needs_bwrap
def test_sandbox_directories_are_removed_when_workers_retire(tmp_path: Path) -> None:
    before = set(sandbox.workspace_root().glob(workspace.SANDBOX_PREFIX + "*"))
    server = sandboxed_server(tmp_path / "server", "--max-requests-per-worker", "1")
    try:
        for _ in range(2):
            _status, body, _ = execute(server.url, run_source("def main():\n    return 1\n"))
            assert body["status"] == "COMPLETED", body
    finally:
        assert server.stop() == 0
    after = set(sandbox.workspace_root().glob(workspace.SANDBOX_PREFIX + "*"))
    assert after - before == set(), server.stderr()[-3000:]


@needs_bwrap
def test_each_child_of_a_sandboxed_fork_server_is_placed_by_its_own_host_pid(
    tmp_path: Path,
) -> None:
    """The front-end moves a sandboxed fork server's child into its cgroups by host pid;
    once it knows the fork server, it looks only among the children it does not know yet:
    never at one forked before (a wrong pid would put another worker in these limits)."""
    from kcoral_server.processes import procfs
    from kcoral_server.processes.launcher.front_end import Launcher

    box = SandboxDir(environ=dict(os.environ))
    launcher = Launcher(wrap=box.command)
    processes, channels = [], []
    try:
        environment = box.environment(sandbox.worker_base_environment())
        for index in range(3):
            procs = tmp_path / f"cgroup-{index}.procs"  # a plain file: shows what was written
            procs.write_text("")
            ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                process = launcher.launch(
                    theirs.fileno(), environment, cgroups=[str(procs)], hold=True
                )
            finally:
                theirs.close()
            processes.append(process)
            channels.append(ours)
            assert procs.read_text() == str(process.pid)
        pids = [process.pid for process in processes]
        assert len(set(pids)) == 3
        assert len({procfs.parent(pid) for pid in pids}) == 1  # the one fork server
        for pid in pids:
            status = Path(f"/proc/{pid}/status").read_text().splitlines()
            nspid = next(line for line in status if line.startswith("NSpid:")).split()
            assert len(nspid) >= 3  # a process of the sandbox's PID namespace
    finally:
        for process in processes:
            process.drop()
        for channel in channels:
            channel.close()
        launcher.close()
        box.remove()
