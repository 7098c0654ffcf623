"""The whole `kcoral run` flow with a local stand-in for the server.

The stand-in executes the program this command builds the way a worker would (runner module
source, `bytes` and file uploads, one `run`, value and folder returns) in a child process
with its own workspace, so every step but HTTP is exercised even where no server is
available.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kcoral.cli import main as kcoral_main
from kcoral.results import ProgramResult, ReturnedFile, ReturnedFolder
from kcoral.run import command as run_cli

_CHILD = """
import json, sys, types
module = types.ModuleType("kcoral_uploaded_runner")
sys.modules[module.__name__] = module
exec(compile(open(sys.argv[1]).read(), "<uploaded>", "exec"), module.__dict__)
inputs = open(sys.argv[2], "rb").read() if sys.argv[2] else None
report = module.run_tool(inputs, json.load(open(sys.argv[3])))
open(sys.argv[4], "w").write(json.dumps(report))
"""


def execute_locally(options: run_cli.RunOptions, program: Any, root: Path) -> ProgramResult:
    instructions = program.instructions
    source = next(item["source"] for item in instructions if item.get("kind") == "module")
    run = next(item for item in instructions if item["op"] == "run")
    inputs_ref, spec = run["args"]
    base = root / f"request-{len(list(root.iterdir()))}"
    workspace = base / "workspace"
    workspace.mkdir(parents=True)
    (base / "runner.py").write_text(source)
    (base / "spec.json").write_text(json.dumps(spec))
    inputs = ""
    if inputs_ref is not None:  # the small inputs, packed
        upload = next(item for item in instructions if item.get("id") == inputs_ref["$ref"])
        (base / "inputs").write_bytes(program.blobs[upload["blob"]])
        inputs = str(base / "inputs")
    for item in instructions:  # the inputs' file uploads, placed as a server places them
        if item.get("kind") == "file":
            (workspace / item["path"]).parent.mkdir(parents=True, exist_ok=True)
            (workspace / item["path"]).write_bytes(program.blobs[item["blob"]])
    child = subprocess.run(
        [sys.executable, "-c", _CHILD, str(base / "runner.py"), inputs,
         str(base / "spec.json"), str(base / "report.json")],
        cwd=workspace, capture_output=True, text=True, check=True,
    )  # fmt: skip
    results: dict[str, Any] = {"status": json.loads((base / "report.json").read_text())}
    if any(item.get("kind") == "folder" for item in instructions):
        results["outputs"] = _folder(workspace / "outputs")
    return ProgramResult(
        "COMPLETED", "local", 0.0, 0.0, 0.0, 0.0, results,
        child.stdout, child.stderr, False, False,
    )  # fmt: skip


def _folder(root: Path) -> ReturnedFolder:
    files, directories = {}, []
    for path in sorted(root.rglob("*")):
        relative = path.relative_to(root).as_posix()
        if path.is_dir():
            directories.append(relative)
        else:
            files[relative] = ReturnedFile(path.read_bytes())
    return ReturnedFolder(files, directories)


@pytest.fixture
def local_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    stand_in = tmp_path / "stand-in"
    stand_in.mkdir()
    monkeypatch.setattr(
        run_cli, "execute", lambda options, program: execute_locally(options, program, stand_in)
    )
    local = tmp_path / "local"
    local.mkdir()
    monkeypatch.chdir(local)
    return local


def run(*argv: str) -> int:
    return kcoral_main(["run", argv[0], "--url", "http://127.0.0.1:9", *argv[1:]])


def test_a_sent_project_runs_and_its_results_come_back_under_out(
    local_server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    project = local_server / "proj"
    (project / "data").mkdir(parents=True)
    (project / "data" / "in.txt").write_text("21")
    (project / "main.py").write_text(
        "import os, sys\n"
        "value = int(open('proj/data/in.txt').read()) * int(sys.argv[1])\n"
        "os.makedirs('results/empty')\n"
        "open('results/value.txt', 'w').write(str(value))\n"
        "print('computed', value)\n"
    )
    argv = ["--send", "proj", "--fetch", "results", "--out", "got", "--", "proj/main.py", "2"]
    assert run("python", *argv) == 0
    assert capsys.readouterr().out == "computed 42\n"
    assert (local_server / "got" / "results" / "value.txt").read_text() == "42"
    assert (local_server / "got" / "results" / "empty").is_dir()


def test_a_relative_shell_command_keeps_its_executable_bit(
    local_server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    script = local_server / "go.sh"
    script.write_text('#!/bin/sh\necho go "$@"\nexit 3\n')
    os.chmod(script, 0o755)
    assert run("shell", "--send", "go.sh", "--", "./go.sh", "now") == 3
    assert capsys.readouterr().out == "go now\n"


def test_missing_output_and_not_installed_tools_exit_1(
    local_server: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("python", "--fetch", "nope", "--out", "o", "--", "-c", "pass") == 1
    assert "missing output nope: not found" in capsys.readouterr().err
    assert not (local_server / "o").exists()  # nothing came back: no empty --out (ae4dfab)
    assert run("ncu", "--out", "o2", "--", "--", "python", "-c", "pass") == 1
    assert "ncu is not installed in the remote server environment" in capsys.readouterr().err
