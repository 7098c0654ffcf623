"""The deployment files agree with the command line: ports, commands, probes, token."""

from __future__ import annotations

import configparser
import shlex
from pathlib import Path

import pytest
from kcoral_server.cli_args import parse_server_args
from kcoral_server.router.settings import SettingsError, parse_router_args

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def unit(name: str) -> configparser.ConfigParser:
    parser = configparser.ConfigParser(strict=False, interpolation=None)
    parser.optionxform = str
    parser.read_string((DEPLOY / "systemd" / name).read_text())
    return parser


def test_the_systemd_units_run_valid_commands_and_restart() -> None:
    router = unit("kcoral-router.service")
    command = shlex.split(router["Service"]["ExecStart"])
    assert command[1] == "router"
    with pytest.raises(SettingsError, match="without a client token"):
        parse_router_args(command[2:], {"KCORAL_NODE_TOKEN": "t"})
    assert "KCORAL_AUTH_TOKEN=" in (DEPLOY / "systemd" / "kcoral-router.service").read_text()
    settings = parse_router_args(command[2:], {"KCORAL_NODE_TOKEN": "t", "KCORAL_AUTH_TOKEN": "c"})
    assert settings.port == 9000 and settings.auth_token == "c"
    node = unit("kcoral-node.service")
    command = shlex.split(node["Service"]["ExecStart"].replace("%l", "gpu-host-1"))
    assert command[1] == "server"
    server = parse_server_args(command[2:], {"KCORAL_NODE_TOKEN": "t"})
    assert server.supervisor is not None and server.config.node_id == "gpu-host-1"
    assert server.config.router_endpoint.endswith(f":{settings.port}")
    for parsed in (router, node):
        assert parsed["Service"]["Restart"] == "always"
        assert "KCORAL_NODE_TOKEN" not in parsed["Service"]["ExecStart"]
    assert int(node["Service"]["TimeoutStopSec"]) >= 900  # long drain


def test_the_kubernetes_manifests_match_the_cli() -> None:
    yaml = pytest.importorskip("yaml")
    router_docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "router.yaml").read_text()))
    deployment = next(d for d in router_docs if d["kind"] == "Deployment")
    service = next(d for d in router_docs if d["kind"] == "Service")
    assert deployment["spec"]["replicas"] == 1
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    assert container["command"][:2] == ["kcoral", "router"]
    secrets = {e["name"]: e["valueFrom"]["secretKeyRef"]["name"] for e in container["env"]}
    client_secret = next(d for d in router_docs if d["kind"] == "Secret")
    assert secrets["KCORAL_AUTH_TOKEN"] == client_secret["metadata"]["name"]
    assert secrets["KCORAL_NODE_TOKEN"] != secrets["KCORAL_AUTH_TOKEN"]
    settings = parse_router_args(container["command"][2:], {"KCORAL_AUTH_TOKEN": "c"})
    ports = {p["containerPort"] for p in container["ports"]}
    assert ports == {settings.port}
    assert container["readinessProbe"]["tcpSocket"]["port"] == settings.port
    assert container["livenessProbe"]["tcpSocket"]["port"] == settings.port
    assert service["spec"]["ports"][0]["targetPort"] == settings.port
    token = container["env"][0]
    assert token["name"] == "KCORAL_NODE_TOKEN" and "secretKeyRef" in token["valueFrom"]

    node_docs = list(yaml.safe_load_all((DEPLOY / "kubernetes" / "node.yaml").read_text()))
    daemonset = next(d for d in node_docs if d["kind"] == "DaemonSet")
    secret = next(d for d in node_docs if d["kind"] == "Secret")
    node = daemonset["spec"]["template"]["spec"]["containers"][0]
    assert node["resources"]["limits"]["nvidia.com/gpu"] >= 1
    command = [arg.replace("$(NODE_NAME)", "worker-7") for arg in node["command"]]
    assert command[:2] == ["kcoral", "server"]
    server = parse_server_args(command[2:], {})
    assert server.config.router_endpoint == (
        f"http://{service['metadata']['name']}:{service['spec']['ports'][0]['port']}"
    )
    env = {e["name"]: e["valueFrom"] for e in node["env"]}
    assert env["KCORAL_NODE_TOKEN"]["secretKeyRef"]["name"] == secret["metadata"]["name"]
    assert env["NODE_NAME"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "--node-token" not in command
