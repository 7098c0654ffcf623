"""The deployment files as data: manifests, the kustomization, build files and units."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
IMAGES = DEPLOY / "images"
SYSTEMD = DEPLOY / "systemd"
# The image each build file produces is named in its header, as the command that builds it.
BUILD_COMMAND = re.compile(
    r"^#\s+(docker build -f (deploy/images/\S+\.Dockerfile) -t (\S+):(\S+) \.)$", re.M
)


def project_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def kustomization() -> dict[str, Any]:
    return yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())


def manifests() -> dict[str, list[dict[str, Any]]]:
    """Every resource file the kustomization lists, as its YAML documents."""
    return {
        name: [d for d in yaml.safe_load_all((KUBERNETES / name).read_text()) if d]
        for name in kustomization()["resources"]
    }


def resource(kind: str, name: str) -> dict[str, Any]:
    for documents in manifests().values():
        for document in documents:
            if document["kind"] == kind and document["metadata"]["name"] == name:
                return document
    raise LookupError(f"no {kind} {name} in deploy/kubernetes")


def container(workload: dict[str, Any]) -> dict[str, Any]:
    (only,) = workload["spec"]["template"]["spec"]["containers"]
    return only


def build_commands() -> dict[str, tuple[str, str, str]]:
    """Build file name -> (command, image name, tag), from each build file's header."""
    found = {}
    for path in sorted(IMAGES.glob("*.Dockerfile")):
        (match,) = BUILD_COMMAND.findall(path.read_text())
        command, named_file, image, tag = match
        assert named_file == f"deploy/images/{path.name}", command
        found[path.name] = (command, image, tag)
    return found


def final_stage_instructions(path: Path) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` of the last stage, continuation lines joined."""
    text = re.sub(r"\\\n", " ", path.read_text())
    lines = [line.strip() for line in text.splitlines()]
    instructions = [tuple(line.split(None, 1)) for line in lines if line and line[0] != "#"]
    last_from = max(i for i, (word, *_rest) in enumerate(instructions) if word == "FROM")
    return [(word.upper(), rest) for word, rest in instructions[last_from:]]


def exec_form(arguments: str) -> list[str]:
    """A JSON-array ``CMD``/``ENTRYPOINT``."""
    value = json.loads(arguments)
    assert isinstance(value, list) and all(isinstance(v, str) for v in value)
    return value


def unit_command(name: str, kcoral: str) -> list[str]:
    """A unit's ``ExecStart`` as arguments, its ``/usr/local/bin/kcoral`` replaced."""
    for line in (SYSTEMD / name).read_text().splitlines():
        if line.startswith("ExecStart="):
            command = shlex.split(line.removeprefix("ExecStart="))
            assert command[0] == "/usr/local/bin/kcoral"
            return [kcoral, *command[1:]]
    raise LookupError(f"{name} has no ExecStart")
