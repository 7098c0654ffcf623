"""`pip install .`, `pip install -e .` and `pip wheel .` with hatchling and hatch-jupyter-builder
(pyproject.toml, issue 30.8), each install with and without npm on PATH.

Every test works on a copy of the working tree (its tracked and not-ignored files, committed
in a fresh git repository, so `git status` there shows what a build wrote) and builds in
pip's isolated build environment, as a user's install does. The copy's labextension sources
are made newer than the committed build, as a fresh clone can leave them: the case in which
hatch-jupyter-builder's staleness check would run npm and rewrite the committed assets.
"With npm" puts a recording `npm` first on PATH (it logs its arguments, then runs the real
npm where there is one), so a test sees any npm call even where no npm is installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import venv
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LABEXTENSION = "share/jupyter/labextensions/kcoral-jupyterlab"
JUPYTER_CONFIG = "etc/jupyter/jupyter_server_config.d/kcoral_jupyter.json"
SOURCE_CONFIG = ROOT / "jupyter_ext/jupyter-config/jupyter_server_config.d/kcoral_jupyter.json"
PACKAGE_TREES = {"kcoral": "kcoral", "kcoral_server": "server", "kcoral_jupyter": "jupyter_ext"}
SYSTEM_PATH = ["/usr/local/bin", "/usr/bin", "/bin"]

# What each installed package's location and each folder's importability look like from a
# directory outside the copy (`python -c` puts the current directory on sys.path).
PROBE = """
import importlib.util, json, sys
import kcoral, kcoral_server, kcoral_jupyter
print(json.dumps({
    "files": {m.__name__: m.__file__ for m in (kcoral, kcoral_server, kcoral_jupyter)},
    "importable": {n: importlib.util.find_spec(n) is not None
                   for n in ("server", "jupyter_ext", "tests", "build_backend")},
    "prefix": sys.prefix,
}))
"""


@dataclass(frozen=True)
class Npm:
    """The PATH a build runs with, and where the recording npm (if on it) logs its calls."""

    path: str
    log: Path

    def calls(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []


def copy_of_the_working_tree(target: Path) -> Path:
    """The working tree's tracked and not-ignored files (uncommitted edits included), with
    fresh mtimes, the labextension sources newest, committed in a new git repository."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=ROOT,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for name in sorted({n for n in listed.split("\0") if n}):
        source = ROOT / name
        if source.is_file():  # a deleted, not yet committed file is still listed
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, target / name)
            shutil.copymode(source, target / name)
    newer = time.time() + 60
    for source in (target / "labextension").rglob("*"):
        if source.is_file():
            os.utime(source, (newer, newer))
    git = [
        "git",
        "-c",
        "user.name=test",
        "-c",
        "user.email=test@invalid",
        "-c",
        "init.defaultBranch=main",
    ]
    subprocess.run([*git, "init", "-q"], cwd=target, check=True)
    subprocess.run([*git, "add", "-A"], cwd=target, check=True)
    subprocess.run([*git, "commit", "-q", "-m", "copy"], cwd=target, check=True)
    return target


def npm_on_path(tmp_path: Path, environment: Path, with_npm: bool) -> Npm:
    """PATH with the environment's scripts first; with npm, the recording npm and the system
    folders follow, without it nothing else (no npm, no node)."""
    log = tmp_path / "npm-calls.log"
    if not with_npm:
        return Npm(str(environment / "bin"), log)
    folder = tmp_path / "npm-bin"
    folder.mkdir()
    real = shutil.which("npm")
    then = f'exec {real} "$@"' if real else "exit 127"
    recording = folder / "npm"
    recording.write_text(f'#!/bin/sh\necho "$*" >> {log}\n{then}\n')
    recording.chmod(0o755)
    return Npm(os.pathsep.join([str(environment / "bin"), str(folder), *SYSTEM_PATH]), log)


def run_pip(environment: Path, npm: Npm, *arguments: str) -> subprocess.CompletedProcess[str]:
    """The environment's pip, with the caller's pip settings (index, cache) and only `npm.path`."""
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    env["PATH"] = npm.path
    done = subprocess.run(
        [str(environment / "bin" / "python"), "-m", "pip", *arguments],
        capture_output=True,
        text=True,
        env=env,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    return done


def package_tree(repository: Path, name: str) -> Path:
    """Where package `name` lives in a checkout: `kcoral/`, `server/kcoral_server/`, ..."""
    folder = PACKAGE_TREES[name]
    return repository / name if folder == name else repository / folder / name


def git_status(repository: Path) -> str:
    return subprocess.run(
        ["git", "status", "--porcelain"], cwd=repository, capture_output=True, text=True, check=True
    ).stdout


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("with_npm", [True, False], ids=["with-npm", "without-npm"])
@pytest.mark.parametrize("editable", [False, True], ids=["install", "editable"])
def test_an_install_puts_packages_labextension_and_jupyter_config_in_place_running_no_npm(
    tmp_path: Path, editable: bool, with_npm: bool
) -> None:
    copy = copy_of_the_working_tree(tmp_path / "copy")
    environment = tmp_path / "env"
    venv.create(environment, with_pip=True, symlinks=True)
    npm = npm_on_path(tmp_path, environment, with_npm)

    run_pip(environment, npm, "install", *(["-e"] if editable else []), str(copy))

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    probe = subprocess.run(
        [str(environment / "bin" / "python"), "-c", PROBE],
        cwd=elsewhere,
        capture_output=True,
        text=True,
        env={"PATH": npm.path},
        check=False,
    )
    assert probe.returncode == 0, probe.stderr
    found = json.loads(probe.stdout)
    site_packages = next((environment / "lib").glob("python3*/site-packages")).resolve()
    for name in PACKAGE_TREES:
        expected = package_tree(copy, name) if editable else site_packages / name
        where = Path(found["files"][name]).resolve()
        assert where == expected / "__init__.py", (name, where)
    assert found["importable"] == dict.fromkeys(found["importable"], False)

    prefix = Path(found["prefix"])
    labextension = prefix / LABEXTENSION
    assert json.loads((labextension / "package.json").read_text())["name"] == "kcoral-jupyterlab"
    assert any((labextension / "static").glob("remoteEntry.*.js"))
    assert (labextension / "schemas" / "kcoral-jupyterlab" / "plugin.json").is_file()
    assert (prefix / JUPYTER_CONFIG).read_text() == SOURCE_CONFIG.read_text()

    assert npm.calls() == []
    assert git_status(copy) == ""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_wheel_holds_every_module_the_labextension_and_the_jupyter_config_only(
    tmp_path: Path,
) -> None:
    copy = copy_of_the_working_tree(tmp_path / "copy")
    npm = npm_on_path(tmp_path, Path(sys.prefix), with_npm=True)

    run_pip(
        Path(sys.prefix), npm, "wheel", "--no-deps", "-q", "-w", str(tmp_path / "wheels"), str(copy)
    )

    (wheel,) = (tmp_path / "wheels").glob("kcoral-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    data = next(n.split("/", 1)[0] for n in names if n.split("/", 1)[0].endswith(".data"))
    assert "kcoral_server/proto/kcoral_gateway_pb2.py" in names
    assert f"{data}/data/{JUPYTER_CONFIG}" in names
    assert f"{data}/data/{LABEXTENSION}/package.json" in names
    assert any(n.startswith(f"{data}/data/{LABEXTENSION}/static/remoteEntry.") for n in names)
    assert f"{data}/data/{LABEXTENSION}/schemas/kcoral-jupyterlab/plugin.json" in names
    for name in PACKAGE_TREES:
        tree = package_tree(ROOT, name)
        for module in tree.rglob("*.py"):
            if "__pycache__" not in module.parts:
                assert f"{name}/{module.relative_to(tree).as_posix()}" in names
    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.startswith("kcoral-")} == set(PACKAGE_TREES)
    assert npm.calls() == []
    assert git_status(copy) == ""
