"""The deployment files as data: manifests, the kustomization, build files and units."""

from __future__ import annotations

import copy
import json
import re
import shlex
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import tomllib
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
KUBERNETES = DEPLOY / "kubernetes"
IMAGES = DEPLOY / "images"
SYSTEMD = DEPLOY / "systemd"
#: the entry point the units start: the virtual environment docs/scaling.md "systemd" makes
UNIT_KCORAL = "/opt/kcoral/bin/kcoral"
# The image each build file produces is named in its header, as the command that builds it.
BUILD_COMMAND = re.compile(
    r"^#\s+(docker build -f (deploy/images/\S+\.Dockerfile) -t (\S+):(\S+) \.)$", re.M
)


def shown_again(covered: Iterable[Path]) -> list[str]:
    """bubblewrap's arguments that show this test's Python and checkout again where a mount
    over one of ``covered`` hid them: a clean clone and its virtual environment in /tmp (as
    a CI's may be) under a unit's private /tmp or a pod's /tmp volume. An image's or a
    unit's install never lives there (``/opt/kcoral``, the image's own)."""
    shown: list[str] = []
    for needed in sorted({Path(sys.prefix), ROOT}):
        if any(needed.is_relative_to(path) for path in covered):
            shown += ["--ro-bind", str(needed), str(needed)]
    return shown


def project_version() -> str:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def kustomization(folder: Path = KUBERNETES) -> dict[str, Any]:
    return yaml.safe_load((folder / "kustomization.yaml").read_text())


def manifests(root: Path = KUBERNETES) -> dict[str, list[dict[str, Any]]]:
    """Every resource file the kustomization in ``root`` reaches (through its overlays into
    the base), by its path under ``root``, as its YAML documents."""
    found: dict[str, list[dict[str, Any]]] = {}
    folders = [root.resolve()]
    while folders:
        folder = folders.pop(0)
        for entry in kustomization(folder)["resources"]:
            path = (folder / entry).resolve()
            name = path.relative_to(root.resolve()).as_posix()
            if path.is_dir():
                folders.append(path)
            elif name not in found:
                found[name] = [d for d in yaml.safe_load_all(path.read_text()) if d]
    return found


def overlays(root: Path = KUBERNETES) -> dict[str, dict[str, Any]]:
    """The overlays the kustomization lists (one per kind of machine): name -> kustomization."""
    listed = [e for e in kustomization(root)["resources"] if e.startswith("overlays/")]
    return {entry.removeprefix("overlays/"): kustomization(root / entry) for entry in listed}


def overlay_patch(overlay: dict[str, Any]) -> list[dict[str, Any]]:
    """An overlay's JSON patch (RFC 6902) of the base's DaemonSet."""
    (patch,) = overlay["patches"]
    assert patch["target"] == {"kind": "DaemonSet", "name": "kcoral-node"}
    return yaml.safe_load(patch["patch"])


def patched(document: dict[str, Any], operations: list[dict[str, Any]]) -> dict[str, Any]:
    """``document`` with a JSON patch applied (the operations kustomize's overlays use: add,
    replace, remove, test), without kubectl: what an overlay makes of the base offline."""
    result = copy.deepcopy(document)
    for operation in operations:
        *parents, last = [
            part.replace("~1", "/").replace("~0", "~")
            for part in operation["path"].lstrip("/").split("/")
        ]
        target: Any = result
        for part in parents:
            target = target[int(part)] if isinstance(target, list) else target[part]
        key: Any = last if isinstance(target, dict) else (len(target) if last == "-" else int(last))
        op = operation["op"]
        if op == "test":
            assert target[key] == operation["value"], operation
        elif op == "remove":
            del target[key]
        elif op == "add" and isinstance(target, list):
            target.insert(key, operation["value"])
        elif op in ("add", "replace"):
            assert op == "add" or key in target or isinstance(target, list), operation
            target[key] = operation["value"]
        else:
            raise AssertionError(f"unexpected patch operation {operation}")
    return result


def resource(kind: str, name: str, root: Path = KUBERNETES) -> dict[str, Any]:
    for documents in manifests(root).values():
        for document in documents:
            if document["kind"] == kind and document["metadata"]["name"] == name:
                return document
    raise LookupError(f"no {kind} {name} in deploy/kubernetes")


def overlay_node(name: str, root: Path = KUBERNETES) -> dict[str, Any]:
    """The DaemonSet overlay ``name`` makes of the base (``patched``), named and labelled as
    its kustomization says."""
    overlay = overlays(root)[name]
    daemonset = patched(resource("DaemonSet", "kcoral-node", root), overlay_patch(overlay))
    daemonset["metadata"]["name"] += overlay["nameSuffix"]
    (labelling,) = overlay["labels"]
    assert labelling["includeSelectors"] is True
    metadata, spec = daemonset["metadata"], daemonset["spec"]
    metadata["labels"] = {**metadata["labels"], **labelling["pairs"]}
    selector = spec["selector"]
    selector["matchLabels"] = {**selector["matchLabels"], **labelling["pairs"]}
    template = spec["template"]["metadata"]
    template["labels"] = {**template["labels"], **labelling["pairs"]}
    return daemonset


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
    """A unit's ``ExecStart`` as arguments, its ``UNIT_KCORAL`` replaced."""
    for line in (SYSTEMD / name).read_text().splitlines():
        if line.startswith("ExecStart="):
            command = shlex.split(line.removeprefix("ExecStart="))
            assert command[0] == UNIT_KCORAL
            return [kcoral, *command[1:]]
    raise LookupError(f"{name} has no ExecStart")
