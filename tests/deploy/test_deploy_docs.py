"""docs/scaling.md "Deploy it" runs on the files as they are: the build commands are the build
files' own, each `sed` edit of the kustomization finds its text and leaves the GPU settings
in agreement, and the names the commands use are the ones the manifests use."""

from __future__ import annotations

import ast
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import yaml
from deploy_files import KUBERNETES, ROOT, build_commands, kustomization, resource

DOCS = ROOT / "docs" / "scaling.md"


def deploy_section() -> str:
    text = DOCS.read_text()
    start = text.index("## Deploy it\n")
    return text[start : text.index("\n## ", start + 1)]


def commands() -> list[str]:
    """Every line of the section's bash blocks."""
    blocks = re.findall(r"```bash\n(.*?)```", deploy_section(), re.S)
    return [line.strip() for block in blocks for line in block.splitlines() if line.strip()]


def test_the_docs_build_each_image_with_the_command_its_build_file_names() -> None:
    built = {command for command, _image, _tag in build_commands().values()}
    assert built <= set(commands())


def test_each_sed_edit_of_the_kustomization_finds_its_text(tmp_path: Path) -> None:
    edits = [c for c in commands() if c.startswith("sed -i") and "kustomization.yaml" in c]
    assert len(edits) == 3  # registry, GPUs per machine, release tag
    for edit in edits:
        copy = tmp_path / "kustomization.yaml"
        shutil.copy(KUBERNETES / "kustomization.yaml", copy)
        sed = edit.split(" && ")[0].replace("deploy/kubernetes/kustomization.yaml", str(copy))
        done = subprocess.run(
            ["bash", "-c", sed],
            env={"REGISTRY": "registry.example.com/ml", "PATH": "/usr/bin:/bin"},
        )
        assert done.returncode == 0
        edited = yaml.safe_load(copy.read_text())
        assert edited != kustomization(), f"{sed} changed nothing"
        # The GPU ids and the device plugin count still agree after the edit.
        (settings,) = edited["configMapGenerator"]
        gpus = settings["literals"][0].split("=", 1)[1].split(",")
        counts = {op["value"] for op in yaml.safe_load(edited["patches"][0]["patch"])}
        assert counts == {len(gpus)}


def test_the_docs_use_the_names_the_manifests_use() -> None:
    text = " ".join(commands())
    selector = resource("DaemonSet", "kcoral-node")["spec"]["template"]["spec"]["nodeSelector"]
    ((label, value),) = selector.items()
    assert f"{label}={value}" in text and f"{label}-" in text
    assert f"-n {kustomization()['namespace']}" in text
    assert "kubectl apply -k deploy/kubernetes" in text
    for generator in kustomization()["secretGenerator"]:
        path = generator["files"][0].split("=", 1)[1]
        assert f"deploy/kubernetes/{path}" in text
    labels = resource("DaemonSet", "kcoral-node")["spec"]["template"]["metadata"]["labels"]
    assert "-l app.kubernetes.io/name=" + labels["app.kubernetes.io/name"] in text
    assert "svc/kcoral-router 9000:9000" in text and "deploy/kcoral-router" in text


def test_the_docs_python_line_is_valid_python() -> None:
    (line,) = [c for c in commands() if c.startswith("python -c ")]
    (_python, _flag, code) = shlex.split(line)
    ast.parse(code)
