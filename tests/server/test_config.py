"""ServerConfig and `kcoral server` arguments (SERVER.md §2, EXTENSIONS.md, ROUTER.md §12)."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from kcoral_server.settings.command_line import (
    ServerSettings,
    build_server_parser,
    parse_server_args,
)
from kcoral_server.settings.config import (
    GIB,
    REDACTED,
    ServerConfig,
    config_for_log,
    default_cache_capacity_bytes,
    flag_settings,
    option_name,
    physical_memory_bytes,
    router_origin_problem,
)

ROUTED = ["--router", "http://router:9000", "--node-id", "node-1"]


def parse(*argv: str, **environ: str) -> ServerSettings:
    return parse_server_args(list(argv), environ)


def refused(capsys: pytest.CaptureFixture[str], *argv: str, **environ: str) -> str:
    with pytest.raises(SystemExit) as excinfo:
        parse(*argv, **environ)
    assert excinfo.value.code == 2
    return capsys.readouterr().err


# ---------------------------------------------------------------- ServerConfig


def test_server_config_module_imports_only_the_standard_library() -> None:
    code = (
        "import sys, kcoral\n"
        "kcoral.ServerConfig()\n"
        "bad = [m for m in ('tornado', 'torch', 'numpy', 'psutil', 'cloudpickle', 'urllib3')"
        " if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_every_field_has_a_default_and_construction_is_keyword_only_in_practice() -> None:
    config = ServerConfig()
    assert config.device == "auto"
    assert config.gpus == [0]
    assert config.num_workers == 1
    assert config.workers_per_gpu == 8
    assert config.max_requests_per_worker == 1
    assert config.worker_termination_grace_seconds == 5
    assert config.worker_wait_timeout_seconds == 1800
    assert config.default_timeout_seconds == 300
    assert config.max_timeout_seconds == 900
    assert config.max_request_bytes == 268435456
    assert config.max_response_bytes == 268435456
    assert config.output_limit_bytes == 1048576
    assert config.max_output_limit_bytes == 16777216
    assert config.disk_cache_capacity_mbytes == 16384
    assert config.log_dir is None
    assert config.log_console is True
    assert config.log_programs is True
    assert config.log_programs_max_bytes == GIB  # the audit's bound on programs/
    assert config.log_events_max_bytes == GIB  # and on events.jsonl
    assert config.sandbox == "auto"  # issue 16: bubblewrap where it works, else loudly none
    assert config.sandbox_readonly_paths == []
    assert config.router_endpoint is None and config.node_id is None and config.node_token is None
    assert config.job_retention_seconds == 3600
    assert config.job_retention_bytes == GIB
    assert config.auth_token_file is None and config.auth_token is None
    assert config.allow_unauthenticated is False
    assert config.max_inflight_request_bytes == 2 * config.max_request_bytes
    # issue 16: limits on by default (None: the default memory share, limits.py)
    assert config.worker_memory_limit_bytes is None
    assert config.worker_process_limit is None
    assert config.worker_env_deny == []
    assert config.fake_gpu_count == 0
    assert not hasattr(config, "host") and not hasattr(config, "port")


def test_the_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        ServerConfig().device = "cpu"  # type: ignore[misc]


def test_the_memory_cache_default_is_at_most_a_quarter_of_physical_memory() -> None:
    memory = physical_memory_bytes()
    assert ServerConfig().cache_capacity_bytes == default_cache_capacity_bytes()
    assert default_cache_capacity_bytes() <= 16 * GIB
    if memory is not None:
        assert default_cache_capacity_bytes() == min(16 * GIB, memory // 4)


def test_the_disk_cache_dir_default_follows_xdg_cache_home(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert ServerConfig().disk_cache_dir == tmp_path / "kcoral" / "files"
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/dir")
    assert ServerConfig().disk_cache_dir == Path.home() / ".cache" / "kcoral" / "files"


@pytest.mark.parametrize(
    "changes",
    [
        {"device": "tpu"},
        {"disk_cache_capacity_mbytes": -1},
        {"sandbox": "docker"},
        {"sandbox": "none", "sandbox_readonly_paths": [Path("/opt")]},
        {"num_workers": 0},
        {"num_workers": 1025},  # each a process: 99,999,999 ran a machine out of memory
        {"workers_per_gpu": 0},
        {"workers_per_gpu": 1025},
        {"max_requests_per_worker": -1},
        {"max_request_bytes": 0},
        {"max_response_bytes": 0},
        {"output_limit_bytes": -1},
        {"max_output_limit_bytes": -1},
        {"cache_capacity_bytes": -1},
        {"default_timeout_seconds": 0},
        {"max_timeout_seconds": float("inf")},
        {"worker_termination_grace_seconds": -1},
        {"worker_wait_timeout_seconds": float("nan")},
        {"job_retention_seconds": -1},
        {"job_retention_bytes": -1},
        {"log_programs_max_bytes": -1},
        {"log_events_max_bytes": -1},
        {"max_inflight_request_bytes": -1},
        {"worker_memory_limit_bytes": -1},
        {"num_workers": True},
        {"num_workers": 1.5},
        {"device": "gpu", "gpus": []},
        {"device": "gpu", "gpus": [-1]},
        {"device": "fake-gpu", "fake_gpu_count": 0},
        {"fake_gpu_count": -1},
        {"router_endpoint": "http://router:9000"},
        {"node_id": "node-1"},
        {"router_endpoint": "ftp://router", "node_id": "n"},
        {"router_endpoint": "http://router:9000", "node_id": "-bad"},
        {"node_token": ""},
        {"allowed_serialization": ["json", "yaml"]},
        {"sandbox_readonly_paths": [Path("/")]},
    ],
)
def test_invalid_settings_raise_value_error(changes) -> None:
    with pytest.raises(ValueError):
        ServerConfig(**changes)


def test_the_test_only_fake_gpu_device_is_accepted() -> None:
    config = ServerConfig(device="fake-gpu", fake_gpu_count=2, gpus=[0, 1])
    assert config.device == "fake-gpu" and config.fake_gpu_count == 2


def test_gpus_are_not_checked_in_cpu_mode() -> None:
    assert ServerConfig(device="cpu", gpus=[]).gpus == []


def test_string_paths_are_accepted_and_an_empty_one_disables() -> None:
    config = ServerConfig(log_dir="logs", disk_cache_dir="")  # type: ignore[arg-type]
    assert config.log_dir == Path("logs")
    assert config.disk_cache_dir is None


def test_secrets_never_appear_in_the_repr() -> None:
    config = ServerConfig(
        router_endpoint="http://r:1", node_id="n", node_token="node-secret", auth_token="auth-xyz"
    )
    assert "node-secret" not in repr(config)
    assert "auth-xyz" not in repr(config)


def test_the_logged_config_redacts_the_node_token_and_omits_the_auth_token(tmp_path) -> None:
    config = ServerConfig(
        router_endpoint="http://r:1",
        node_id="n",
        node_token="node-secret",
        auth_token="auth-xyz",
        log_dir=tmp_path,
        sandbox_readonly_paths=[tmp_path],
    )
    logged = config_for_log(config)
    assert logged["node_token"] == REDACTED
    assert "auth_token" not in logged
    assert "auth-xyz" not in repr(logged) and "node-secret" not in repr(logged)
    assert logged["log_dir"] == str(tmp_path)
    assert logged["sandbox_readonly_paths"] == [str(tmp_path)]
    json.dumps(logged)  # plain JSON values only


def test_an_unset_node_token_is_logged_as_null() -> None:
    assert config_for_log(ServerConfig())["node_token"] is None


def test_the_auth_token_is_read_from_its_file(tmp_path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("  s3cret\n")
    assert ServerConfig(auth_token_file=token_file).read_auth_token() == "s3cret"
    token_file.write_text("\n")
    with pytest.raises(ValueError, match="empty"):
        ServerConfig(auth_token_file=token_file).read_auth_token()
    with pytest.raises(ValueError, match="cannot be read"):
        ServerConfig(auth_token_file=tmp_path / "missing").read_auth_token()


@pytest.mark.parametrize(
    ("origin", "ok"),
    [
        ("http://router:9000", True),
        ("https://router.example", True),
        ("http://router:9000/", True),
        ("http://[::1]:9000", True),
        ("http://router:9000/path", False),
        ("http://router:9000?x=1", False),
        ("http://router:9000#frag", False),
        ("http://user@router:9000", False),
        ("grpc://router:9000", False),
        ("router:9000", False),
        ("http://", False),
        ("http://router:99999", False),
        ("http://router:0", False),
    ],
)
def test_router_origins_are_bare_http_or_https_origins(origin, ok) -> None:
    assert (router_origin_problem(origin) is None) is ok


# ---------------------------------------------------------------- command line defaults


def test_without_arguments_the_cli_defaults_apply(tmp_path) -> None:
    settings = parse(HOME=str(tmp_path))
    assert settings.host == "127.0.0.1"
    assert settings.port == 8000
    assert settings.ready_file is None
    assert settings.supervisor is None
    assert settings.node_child is False
    assert settings.gpus_given is False
    config = settings.config
    assert config.device == "auto"
    assert config.gpus == [0]
    assert config.log_dir == Path("logs")
    assert config.disk_cache_dir == tmp_path / ".cache" / "kcoral" / "files"
    assert config.log_console and config.log_programs
    assert config.log_programs_max_bytes == GIB
    assert config.log_events_max_bytes == GIB
    assert config.sandbox == "auto"  # issue 16: bubblewrap where it works, else loudly none
    assert config.allowed_serialization == ["json", "pickle"]


def test_the_disk_cache_dir_default_uses_an_absolute_xdg_cache_home(tmp_path) -> None:
    settings = parse(XDG_CACHE_HOME=str(tmp_path), HOME="/nowhere")
    assert settings.config.disk_cache_dir == tmp_path / "kcoral" / "files"
    settings = parse(XDG_CACHE_HOME="not/absolute", HOME=str(tmp_path))
    assert settings.config.disk_cache_dir == tmp_path / ".cache" / "kcoral" / "files"


def test_every_option_maps_onto_its_field(tmp_path) -> None:
    settings = parse(
        "--host", "0.0.0.0",
        "--port", "0",
        "--ready-file", str(tmp_path / "ready"),
        "--device", "gpu",
        "--gpus", "1,,3,",
        "--num-workers", "3",
        "--workers-per-gpu", "2",
        "--max-requests-per-worker", "0",
        "--worker-termination-grace-seconds", "0.5",
        "--worker-wait-timeout-seconds", "10",
        "--default-timeout-seconds", "30",
        "--max-timeout-seconds", "60.5",
        "--max-request-bytes", "1000",
        "--max-response-bytes", "2000",
        "--output-limit-bytes", "0",
        "--max-output-limit-bytes", "4096",
        "--cache-capacity-bytes", "123456",
        "--disk-cache-dir", str(tmp_path / "disk"),
        "--disk-cache-capacity-mbytes", "7",
        "--log-dir", str(tmp_path / "logs"),
        "--no-log-console",
        "--no-log-programs",
        "--log-programs-max-bytes", "512M",
        "--sandbox-readonly-path", "/usr/share",
        "--sandbox-readonly-path", "/usr/lib",
        "--allow-unauthenticated",
        "--job-retention-seconds", "5",
        "--job-retention-bytes", "99",
        "--max-inflight-request-bytes", "5000",
        "--worker-memory-limit-bytes", "1048576",
    )  # fmt: skip
    config = settings.config
    assert (settings.host, settings.port) == ("0.0.0.0", 0)
    assert settings.ready_file == tmp_path / "ready"
    assert settings.gpus_given is True
    assert config.device == "gpu"
    assert config.gpus == [1, 3]
    assert config.num_workers == 3
    assert config.workers_per_gpu == 2
    assert config.max_requests_per_worker == 0
    assert config.worker_termination_grace_seconds == 0.5
    assert config.worker_wait_timeout_seconds == 10
    assert config.default_timeout_seconds == 30
    assert config.max_timeout_seconds == 60.5
    assert config.max_request_bytes == 1000
    assert config.max_response_bytes == 2000
    assert config.output_limit_bytes == 0
    assert config.max_output_limit_bytes == 4096
    assert config.cache_capacity_bytes == 123456
    assert config.disk_cache_dir == tmp_path / "disk"
    assert config.disk_cache_capacity_mbytes == 7
    assert config.log_dir == tmp_path / "logs"
    assert config.log_console is False and config.log_programs is False
    assert config.log_programs_max_bytes == 512 * 1024 * 1024
    assert config.sandbox_readonly_paths == [Path("/usr/share"), Path("/usr/lib")]
    assert config.allow_unauthenticated is True
    assert config.job_retention_seconds == 5
    assert config.job_retention_bytes == 99
    assert config.max_inflight_request_bytes == 5000
    assert config.worker_memory_limit_bytes == 1048576


def test_the_inflight_limit_defaults_to_twice_the_request_limit() -> None:
    assert parse("--max-request-bytes", "100").config.max_inflight_request_bytes == 200


def test_empty_disk_cache_and_log_dirs_disable_them() -> None:
    config = parse("--disk-cache-dir", "", "--log-dir", "").config
    assert config.disk_cache_dir is None
    assert config.log_dir is None


def test_cpu_mode_and_sandbox_none_are_accepted() -> None:
    config = parse("--device", "cpu", "--sandbox", "none").config
    assert (config.device, config.sandbox) == ("cpu", "none")


def test_gpus_are_ignored_in_cpu_mode() -> None:
    assert parse("--device", "cpu", "--gpus", "").config.device == "cpu"
    assert parse("--device", "cpu", "--gpus", "x").config.device == "cpu"


def test_the_hidden_fake_gpu_mode_is_accepted() -> None:
    config = parse("--device", "fake-gpu", "--fake-gpu-count", "2", "--gpus", "0,1").config
    assert (config.device, config.fake_gpu_count, config.gpus) == ("fake-gpu", 2, [0, 1])


# ---------------------------------------------------------------- environment


def test_environment_variables_supply_values() -> None:
    settings = parse(
        KCORAL_SERVER_HOST="10.0.0.1",
        KCORAL_SERVER_PORT="9001",
        KCORAL_SERVER_DEVICE="cpu",
        KCORAL_SERVER_GPUS="2,3",
        KCORAL_LOG_DIR="/tmp/kc-logs",
    )
    assert (settings.host, settings.port) == ("10.0.0.1", 9001)
    assert settings.config.device == "cpu"
    assert settings.config.gpus == [2, 3]
    assert settings.gpus_given is True
    assert settings.config.log_dir == Path("/tmp/kc-logs")


def test_flags_take_precedence_over_environment_variables() -> None:
    settings = parse(
        "--host", "127.0.0.2", "--port", "9100", "--device", "gpu", "--gpus", "5",
        "--log-dir", "mine",
        KCORAL_SERVER_HOST="10.0.0.1",
        KCORAL_SERVER_PORT="9001",
        KCORAL_SERVER_DEVICE="cpu",
        KCORAL_SERVER_GPUS="2,3",
        KCORAL_LOG_DIR="/tmp/kc-logs",
    )  # fmt: skip
    assert (settings.host, settings.port) == ("127.0.0.2", 9100)
    assert settings.config.device == "gpu"
    assert settings.config.gpus == [5]
    assert settings.config.log_dir == Path("mine")


def test_an_empty_log_dir_environment_value_disables_file_logging() -> None:
    assert parse(KCORAL_LOG_DIR="").config.log_dir is None


def test_router_and_node_come_from_the_environment() -> None:
    settings = parse(
        KCORAL_ROUTER_ENDPOINT="http://router:9000",
        KCORAL_NODE_ID="node-7",
        KCORAL_NODE_TOKEN="tok",
    )
    config = settings.config
    assert (config.router_endpoint, config.node_id, config.node_token) == (
        "http://router:9000",
        "node-7",
        "tok",
    )
    assert settings.supervisor is not None


def test_empty_router_node_and_token_environment_values_count_as_unset() -> None:
    settings = parse(KCORAL_ROUTER_ENDPOINT="", KCORAL_NODE_ID="", KCORAL_NODE_TOKEN="")
    config = settings.config
    assert (config.router_endpoint, config.node_id, config.node_token) == (None, None, None)
    assert settings.supervisor is None


def test_the_node_token_flag_overrides_the_environment() -> None:
    config = parse(*ROUTED, "--node-token", "flag", KCORAL_NODE_TOKEN="env").config
    assert config.node_token == "flag"


def test_the_auth_token_comes_from_the_environment_or_a_file(tmp_path) -> None:
    assert parse(KCORAL_AUTH_TOKEN="env-token").config.auth_token == "env-token"
    assert parse(KCORAL_AUTH_TOKEN="").config.auth_token is None
    token_file = tmp_path / "token"
    token_file.write_text("file-token\n")
    config = parse("--auth-token-file", str(token_file), KCORAL_AUTH_TOKEN="env-token").config
    assert config.auth_token == "file-token"
    assert config.auth_token_file == token_file
    assert config.read_auth_token() == "file-token"


def test_allowed_serialization_formats_come_from_the_environment() -> None:
    config = parse(KCORAL_ALLOWED_SERIALIZATION="json").config
    assert config.allowed_serialization == ["json"]
    config = parse(KCORAL_ALLOWED_SERIALIZATION="pickle, json").config
    assert config.allowed_serialization == ["pickle", "json"]


# ---------------------------------------------------------------- refusals


@pytest.mark.parametrize(
    "argv",
    [
        ["--num-work", "2"],
        ["--dev", "cpu"],
        ["--max-request", "10"],
        ["--no-log"],
    ],
)
def test_option_abbreviations_are_refused(capsys, argv) -> None:
    assert "unrecognized arguments" in refused(capsys, *argv)


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--port", "65536"], "--port"),
        (["--port", "-1"], "--port"),
        (["--port", "http"], "--port"),
        (["--device", "tpu"], "--device"),
        (["--device", "gpu", "--gpus", ""], "--gpus"),
        (["--device", "gpu", "--gpus", "0,x"], "--gpus"),
        (["--gpus", "-1"], "--gpus"),
        (["--device", "gpu", "--gpus", "1,0,1"], "--gpus names GPU 1 twice"),
        (["--num-workers", "0"], "--num-workers"),
        (["--num-workers", "99999999"], "--num-workers must be at most 1024"),
        (["--workers-per-gpu", "0"], "--workers-per-gpu"),
        (["--max-requests-per-worker", "-1"], "--max-requests-per-worker"),
        (["--max-request-bytes", "1.5G"], "--max-request-bytes"),
        (["--max-request-bytes", "1_000"], "--max-request-bytes"),
        (["--max-request-bytes", "1e6"], "--max-request-bytes"),
        (["--max-request-bytes", "0"], "--max-request-bytes"),
        (["--cache-capacity-bytes", "16GB"], "--cache-capacity-bytes"),
        (["--disk-cache-capacity-mbytes", "-1"], "--disk-cache-capacity-mbytes"),
        (["--default-timeout-seconds", "0"], "--default-timeout-seconds"),
        (["--max-timeout-seconds", "inf"], "--max-timeout-seconds"),
        (["--worker-wait-timeout-seconds", "nan"], "--worker-wait-timeout-seconds"),
        (["--output-limit-bytes", "-5"], "--output-limit-bytes"),
        (["--sandbox", "docker"], "--sandbox"),
        (["--sandbox", "none", "--sandbox-readonly-path", "/opt"], "--sandbox-readonly-path"),
        (
            ["--sandbox-readonly-path", "/nonexistent-kcoral-path"],
            "--sandbox-readonly-path /nonexistent-kcoral-path does not exist",
        ),
        (["--sandbox-readonly-path", "/dev/shm"], "lies under /dev/shm"),
        (["--router", "http://router:9000"], "--router requires --node-id"),
        (["--node-id", "node-1"], "--node-id requires --router"),
        (["--router", "http://router/x", "--node-id", "n"], "--router"),
        (["--router", "http://router", "--node-id", "_bad"], "--node-id"),
        ([*ROUTED, "--node-token", ""], "--node-token"),
        (["--host", ""], "--host"),
        (["--job-retention-seconds", "-1"], "--job-retention-seconds"),
        (["--worker-memory-limit-bytes", "-1"], "--worker-memory-limit-bytes"),
        (["--log-programs-max-bytes", "-1"], "--log-programs-max-bytes"),
        (["--log-programs-max-bytes", "1GB"], "--log-programs-max-bytes"),
        (["--device", "fake-gpu"], "--fake-gpu-count"),
        (["--node-child"], "--node-child requires --router"),
        (["--unknown-option"], "unrecognized arguments"),
    ],
)
def test_invalid_settings_exit_with_status_2_and_a_message(capsys, argv, needle) -> None:
    assert needle in refused(capsys, *argv)


@pytest.mark.parametrize(
    ("environ", "needle"),
    [
        ({"KCORAL_SERVER_PORT": "eighty"}, "KCORAL_SERVER_PORT"),
        # the rule, then where the value came from (flags soak: only "--port" was named)
        (
            {"KCORAL_SERVER_PORT": "70000"},
            "--port must be in 0-65535 (got 70000) (from KCORAL_SERVER_PORT)",
        ),
        ({"KCORAL_SERVER_HOST": ""}, "KCORAL_SERVER_HOST must not be empty"),
        ({"KCORAL_SERVER_DEVICE": "tpu"}, "(from KCORAL_SERVER_DEVICE)"),
        ({"KCORAL_SERVER_GPUS": "a,b"}, "KCORAL_SERVER_GPUS"),
        ({"KCORAL_ROUTER_ENDPOINT": "http://router:9000"}, "--router requires --node-id"),
        ({"KCORAL_NODE_ID": "node"}, "--node-id requires --router"),
        ({"KCORAL_ALLOWED_SERIALIZATION": "json,yaml"}, "KCORAL_ALLOWED_SERIALIZATION"),
        # was checked only once workers had started: exit 1, the variable unnamed
        ({"KCORAL_AUTH_TOKEN": "a\nb"}, "KCORAL_AUTH_TOKEN: line 1: expected 'NAME TOKEN'"),
    ],
)
def test_invalid_environment_values_exit_with_status_2(capsys, environ, needle) -> None:
    assert needle in refused(capsys, **environ)


@pytest.mark.parametrize("value", ["scr\x1bape", "scr ape", "scr\u00e9pe", "scrape\n"])
def test_a_metrics_token_no_header_can_carry_is_refused_without_showing_it(capsys, value) -> None:
    # It took any text without surrounding spaces: an escape or an accented letter started
    # a server whose scraper could never send that token.
    said = refused(capsys, KCORAL_METRICS_TOKEN=value)
    assert "--metrics-token must be printable ASCII without spaces" in said
    assert "(from KCORAL_METRICS_TOKEN)" in said
    assert "scr" not in said


def test_an_unreadable_auth_token_file_stops_start_up(capsys, tmp_path) -> None:
    err = refused(capsys, "--auth-token-file", str(tmp_path / "missing"))
    assert "--auth-token-file" in err
    empty = tmp_path / "empty"
    empty.write_text("")
    assert "--auth-token-file" in refused(capsys, "--auth-token-file", str(empty))


# ---------------------------------------------------------------- supervisor options


SUPERVISOR_ARGS = [
    "--health-interval-seconds", "0.5",
    "--health-timeout-seconds", "0.25",
    "--failure-threshold", "5",
    "--startup-grace-seconds", "0",
    "--stable-reset-seconds", "10",
    "--termination-grace-seconds", "1",
    "--restart-min-delay-seconds", "2",
    "--restart-max-delay-seconds", "4",
    "--restart-jitter", "0.5",
]  # fmt: skip


def test_supervisor_options_are_accepted_with_router() -> None:
    supervisor = parse(*ROUTED, *SUPERVISOR_ARGS).supervisor
    assert supervisor is not None
    assert supervisor.health_interval_seconds == 0.5
    assert supervisor.health_timeout_seconds == 0.25
    assert supervisor.failure_threshold == 5
    assert supervisor.startup_grace_seconds == 0
    assert supervisor.stable_reset_seconds == 10
    assert supervisor.termination_grace_seconds == 1
    assert supervisor.restart_min_delay_seconds == 2
    assert supervisor.restart_max_delay_seconds == 4
    assert supervisor.restart_jitter == 0.5


def test_supervisor_defaults_apply_with_router() -> None:
    supervisor = parse(*ROUTED).supervisor
    assert supervisor is not None
    assert (supervisor.health_interval_seconds, supervisor.failure_threshold) == (2, 3)
    assert supervisor.restart_jitter == 0.2


@pytest.mark.parametrize("option", SUPERVISOR_ARGS[::2])
def test_each_supervisor_option_requires_router(capsys, option) -> None:
    value = SUPERVISOR_ARGS[SUPERVISOR_ARGS.index(option) + 1]
    assert f"{option} requires --router" in refused(capsys, option, value)


@pytest.mark.parametrize(
    "argv",
    [
        ["--health-interval-seconds", "0"],
        ["--health-timeout-seconds", "-1"],
        ["--failure-threshold", "0"],
        ["--restart-min-delay-seconds", "0"],
        ["--restart-max-delay-seconds", "0"],
        ["--restart-min-delay-seconds", "5", "--restart-max-delay-seconds", "4"],
        ["--startup-grace-seconds", "-1"],
        ["--stable-reset-seconds", "-1"],
        ["--termination-grace-seconds", "-1"],
        ["--restart-jitter", "0.6"],
        ["--restart-jitter", "-0.1"],
        ["--health-interval-seconds", "inf"],
    ],
)
def test_invalid_supervisor_options_exit_with_status_2(capsys, argv) -> None:
    refused(capsys, *ROUTED, *argv)


def test_the_node_child_never_gets_supervisor_options() -> None:
    settings = parse(
        "--node-child", KCORAL_ROUTER_ENDPOINT="http://router:9000", KCORAL_NODE_ID="n1"
    )
    assert settings.node_child is True
    assert settings.supervisor is None
    assert settings.config.node_id == "n1"


def test_help_lists_server_and_node_options_and_hides_the_internal_and_test_ones(capsys) -> None:
    with pytest.raises(SystemExit) as excinfo:
        parse("--help")
    assert excinfo.value.code == 0
    out = capsys.readouterr().out
    for option in ("--port", "--device", "--disk-cache-dir", "--router", "--ready-file"):
        assert option in out
    # the node supervisor's options: docs/scaling.md and ROUTER §12 name them, and an
    # operator looked for them in --help in vain (deploy soak)
    node_options = out.split("router and node:", 1)[1].split("examples:", 1)[0]
    for option in SUPERVISOR_ARGS[::2]:
        assert f"  {option} " in node_options, option
    for option in ("--node-child", "--fake-gpu-count", "fake-gpu"):
        assert option not in out


def test_each_declared_setting_has_one_option_in_help_and_errors_name_that_option() -> None:
    text = build_server_parser().format_help()
    declared = flag_settings()
    assert {"log_dir", "log_console", "router_endpoint", "auth_token_file"} <= {
        s.name for s in declared
    }
    for setting in declared:
        flag = setting.metadata["flag"]
        assert option_name(setting.name) == flag
        shown = len(re.findall(rf"^\s+{re.escape(flag)}(?![\w-])", text, re.MULTILINE))
        assert shown == (0 if setting.metadata["hidden"] else 1), flag
