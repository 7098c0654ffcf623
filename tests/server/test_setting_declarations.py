"""Each declared ``kcoral server`` setting (``config.setting``) round-trips from its flag,
from its variable and from nothing to the same place; bad values of each list kind are usage
errors (SERVER.md §2, EXTENSIONS.md §2/§6, ROUTER.md §12). The ``kcoral router`` options
(ROUTER.md §11) are declared the same way."""

from __future__ import annotations

import argparse
import re
from dataclasses import MISSING, Field, dataclass
from pathlib import Path
from typing import Any

import pytest
from kcoral_server.router.settings import RouterSettings, parse_router_args
from kcoral_server.settings.command_line import (
    ServerSettings,
    SupervisorOptions,
    _Resolver,
    add_grouped_options,
    parse_server_args,
    supervisor_flags,
)
from kcoral_server.settings.config import SETTING_GROUPS, declared_settings, flag_settings, setting

ROUTED = ("--router", "http://router:9000", "--node-id", "node-1")
TOKEN_FILE = "token-file"  # a placeholder: the test writes a real token file for it

#: setting -> (the text given, the value expected, other options that value needs)
SAMPLES: dict[str, tuple[str, Any, tuple[str, ...]]] = {
    "host": ("0.0.0.0", "0.0.0.0", ()),
    "port": ("8123", 8123, ()),
    "ready_file": ("/tmp/kcoral-ready", Path("/tmp/kcoral-ready"), ()),
    "device": ("cpu", "cpu", ()),
    "gpus": ("1,2", [1, 2], ()),
    "num_workers": ("3", 3, ()),
    "workers_per_gpu": ("2", 2, ()),
    "max_requests_per_worker": ("0", 0, ()),
    "worker_termination_grace_seconds": ("2.5", 2.5, ()),
    "worker_wait_timeout_seconds": ("10", 10.0, ()),
    "body_timeout_seconds": ("7", 7.0, ()),
    "request_head_timeout_seconds": ("3", 3.0, ()),
    "default_timeout_seconds": ("30", 30.0, ()),
    "max_timeout_seconds": ("60", 60.0, ()),
    "max_request_bytes": ("1000", 1000, ()),
    "max_response_bytes": ("2000", 2000, ()),
    "output_limit_bytes": ("300", 300, ()),
    "max_output_limit_bytes": ("400", 400, ()),
    "cache_capacity_bytes": ("5000", 5000, ()),
    "disk_cache_dir": ("/tmp/kcoral-blobs", Path("/tmp/kcoral-blobs"), ()),
    "disk_cache_capacity_mbytes": ("12", 12, ()),
    "log_dir": ("/tmp/kcoral-logs", Path("/tmp/kcoral-logs"), ()),
    "log_console": ("", False, ()),
    "log_programs": ("", False, ()),
    "log_programs_max_bytes": ("512M", 512 * 1024 * 1024, ()),
    "log_events_max_bytes": ("64M", 64 * 1024 * 1024, ()),
    "log_runs_max": ("4", 4, ()),
    "spare_workers": ("", False, ()),
    "sandbox": ("none", "none", ()),
    "sandbox_readonly_paths": ("/usr/share", [Path("/usr/share")], ()),  # one that exists
    "router_endpoint": ("http://router:9000", "http://router:9000", ("--node-id", "n1")),
    "node_id": ("node-7", "node-7", ("--router", "http://router:9000")),
    "node_token": ("node-secret", "node-secret", ()),
    "node_labels": (
        "pool=big",
        ["pool=big"],
        ("--router", "http://router:9000", "--node-id", "n1"),
    ),
    "metrics_token": ("scraper-secret", "scraper-secret", ()),
    "auth_token_file": (TOKEN_FILE, TOKEN_FILE, ()),
    "allow_unauthenticated": ("", True, ()),
    "job_retention_seconds": ("0", 0.0, ()),
    "job_retention_bytes": ("0", 0, ()),
    "max_sessions": ("4", 4, ()),
    "max_sessions_per_identity": ("1", 1, ()),
    "max_queued_jobs": ("64", 64, ()),
    "session_idle_seconds": ("9", 9.0, ()),
    "max_inflight_request_bytes": ("0", 0, ()),
    "worker_memory_limit_bytes": ("0", 0, ()),
    "worker_process_limit": ("64", 64, ()),
    "workspace_limit_bytes": ("1000", 1000, ()),
    "worker_preload": ("none", "none", ()),
    "worker_env_deny": ("AWS_*", ["AWS_*"], ()),
    "worker_env_allow": ("HF_TOKEN", ["HF_TOKEN"], ()),
    "allowed_origins": ("https://lab.example.org", ["https://lab.example.org"], ()),
    "allowed_hosts": ("lab.example.org", ["lab.example.org"], ()),
    "fake_gpu_count": ("2", 2, ()),
    "health_interval_seconds": ("4", 4.0, ROUTED),
    "health_timeout_seconds": ("0.5", 0.5, ROUTED),
    "failure_threshold": ("5", 5, ROUTED),
    "startup_grace_seconds": ("0", 0.0, ROUTED),
    "stable_reset_seconds": ("1", 1.0, ROUTED),
    "termination_grace_seconds": ("3", 3.0, ROUTED),
    "restart_min_delay_seconds": ("2", 2.0, ROUTED),
    "restart_max_delay_seconds": ("40", 40.0, ROUTED),
    "restart_jitter": ("0.1", 0.1, ROUTED),
    "metrics_interval_seconds": ("0", 0.0, ROUTED),
}

DECLARED = [
    *declared_settings(ServerSettings),
    *flag_settings(),
    *declared_settings(SupervisorOptions),
]
WITH_VARIABLE = [declared for declared in DECLARED if declared.metadata["env"]]


def settings_value(settings: ServerSettings, name: str) -> Any:
    for holder in (settings, settings.config, settings.supervisor):
        if holder is not None and name in {f.name for f in declared_settings(type(holder))}:
            return getattr(holder, name)
    raise AssertionError(f"{name} is not a declared setting")


def given(declared: Field, tmp_path: Path) -> tuple[str, Any, tuple[str, ...]]:
    text, expected, companions = SAMPLES[declared.name]
    if text == TOKEN_FILE:
        token_file = tmp_path / "token"
        token_file.write_text("a-client-token\n", encoding="utf-8")
        return str(token_file), token_file, companions
    return text, expected, companions


def test_every_declared_setting_has_a_sample_here() -> None:
    assert sorted(SAMPLES) == sorted(declared.name for declared in DECLARED)


@pytest.mark.parametrize("declared", DECLARED, ids=lambda d: d.metadata["flag"])
def test_a_declared_setting_comes_from_its_flag(declared: Field, tmp_path: Path) -> None:
    text, expected, companions = given(declared, tmp_path)
    flag = declared.metadata["flag"]
    argv = [flag] if declared.metadata["kind"] == "switch" else [flag, text]
    settings = parse_server_args([*argv, *companions], {})
    assert settings_value(settings, declared.name) == expected


@pytest.mark.parametrize("declared", WITH_VARIABLE, ids=lambda d: d.metadata["env"])
def test_a_declared_setting_comes_from_its_variable_when_the_flag_is_absent(
    declared: Field, tmp_path: Path
) -> None:
    text, expected, companions = given(declared, tmp_path)
    settings = parse_server_args(list(companions), {declared.metadata["env"]: text})
    assert settings_value(settings, declared.name) == expected


@pytest.mark.parametrize("declared", WITH_VARIABLE, ids=lambda d: d.metadata["env"])
def test_a_declared_settings_flag_wins_over_its_variable(declared: Field, tmp_path: Path) -> None:
    text, expected, companions = given(declared, tmp_path)
    variable_text = "3,4" if declared.name == "gpus" else text + "9"
    argv = [declared.metadata["flag"], text, *companions]
    settings = parse_server_args(argv, {declared.metadata["env"]: variable_text})
    assert settings_value(settings, declared.name) == expected


@pytest.mark.parametrize("declared", DECLARED, ids=lambda d: d.metadata["flag"])
def test_a_declared_setting_left_out_takes_its_declared_default(declared: Field) -> None:
    # a supervisor option exists only with a router; the others need nothing else
    companions = (
        ROUTED if declared.name in {f.name for f in declared_settings(SupervisorOptions)} else ()
    )
    environ = {"HOME": "/home/someone", "XDG_CACHE_HOME": ""}
    settings = parse_server_args(list(companions), environ)
    meta = declared.metadata
    if meta["cli_default"] is not MISSING:
        default = meta["cli_default"]
        expected = Path(default(environ) if callable(default) else default)
    elif declared.default_factory is not MISSING:
        expected = declared.default_factory()
    else:
        expected = declared.default
    if declared.name == "max_inflight_request_bytes":  # None: twice the request limit
        expected = 2 * settings.config.max_request_bytes
    assert settings_value(settings, declared.name) == expected


def refused(capsys: pytest.CaptureFixture[str], argv: list[str], **environ: str) -> str:
    with pytest.raises(SystemExit) as excinfo:
        parse_server_args(argv, environ)
    assert excinfo.value.code == 2
    return capsys.readouterr().err.strip().splitlines()[-1]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sandbox-readonly-path", ""], "--sandbox-readonly-path must not be empty"),
        (["--sandbox-readonly-path", "/"], "--sandbox-readonly-path must not be '/'"),
        (
            ["--sandbox-readonly-path", "/opt", "--sandbox-readonly-path", "/"],
            "--sandbox-readonly-path must not be '/'",
        ),
        (["--worker-env-deny", "A=B"], "--worker-env-deny must be a list of variable names"),
        (["--worker-env-deny", ""], "--worker-env-deny must be a list of variable names"),
        (["--worker-env-allow", "A=B"], "--worker-env-allow must be a list of variable names"),
        (["--worker-env-allow", ""], "--worker-env-allow must be a list of variable names"),
        (["--allowed-origin", "*"], "--allowed-origin must name one origin"),
        (["--allowed-origin", "https://a.example/path"], "--allowed-origin"),
        (["--allowed-host", "a.example/x"], "--allowed-host must be a bare host name"),
        (["--allowed-host", "*.example.org"], "--allowed-host must be a bare host name"),
        (["--gpus", "0,x"], "--gpus: not a GPU id: 'x'"),
        (["--gpus", "-1"], "--gpus: not a GPU id: '-1'"),
    ],
)
def test_a_bad_value_of_a_list_setting_is_a_usage_error_naming_its_option(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert message in refused(capsys, argv)


def test_a_bad_gpu_list_in_the_variable_is_a_usage_error_naming_the_variable(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert "KCORAL_SERVER_GPUS: not a GPU id: 'x'" in refused(capsys, [], KCORAL_SERVER_GPUS="x")


def test_a_supervisor_option_without_a_router_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    for flag in supervisor_flags():
        assert refused(capsys, [flag, "1"]).endswith(f"{flag} requires --router")


def test_a_non_numeric_supervisor_option_is_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert "invalid number" in refused(capsys, [*ROUTED, "--restart-jitter", "much"])


#: ``kcoral router`` option -> (the text given, the value expected)
ROUTER_SAMPLES: dict[str, tuple[str, Any]] = {
    "host": ("127.0.0.2", "127.0.0.2"),
    "port": ("9100", 9100),
    "grpc_port": ("9200", 9200),
    "status_check_interval_seconds": ("2", 2.0),
    "max_status_age_seconds": ("6", 6.0),
    "reconnect_grace_seconds": ("12", 12.0),
    "unhealthy_threshold": ("4", 4),
    "recovery_threshold": ("3", 3),
    "queue_wait_timeout_seconds": ("60", 60.0),
    "stop_grace_seconds": ("5", 5.0),
    "max_queued_requests": ("10", 10),
    "max_slots_per_node": ("64", 64),
    "node_retention_seconds": ("700", 700.0),
    "max_request_bytes": ("1000", 1000),
    "request_head_timeout_seconds": ("3", 3.0),
    "node_token": ("node-secret", "node-secret"),
    "metrics_token": ("scraper-secret", "scraper-secret"),
    "ready_file": ("/tmp/kcoral-router-ready", Path("/tmp/kcoral-router-ready")),
    "allow_unauthenticated": ("", True),
    "allow_unauthenticated_nodes": ("", True),
    "allowed_origins": ("https://lab.example.org", ("https://lab.example.org",)),
    "allowed_hosts": ("lab.example.org", ("lab.example.org",)),
}
ROUTER_DECLARED = declared_settings(RouterSettings)


def test_every_declared_router_option_has_a_sample_here() -> None:
    assert sorted(ROUTER_SAMPLES) == sorted(declared.name for declared in ROUTER_DECLARED)


@pytest.mark.parametrize("declared", ROUTER_DECLARED, ids=lambda d: d.metadata["flag"])
def test_a_declared_router_option_comes_from_its_flag_or_takes_its_default(
    declared: Field,
) -> None:
    text, expected = ROUTER_SAMPLES[declared.name]
    flag = declared.metadata["flag"]
    argv = [flag] if declared.metadata["kind"] == "switch" else [flag, text]
    assert getattr(parse_router_args(argv, {}), declared.name) == expected
    assert getattr(parse_router_args([], {}), declared.name) == declared.default


def test_the_router_help_shows_each_declared_default_once(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as excinfo:
        parse_router_args(["--help"], {})
    assert excinfo.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    assert text.count("(default 9000)") == 1 and text.count("(default 1800)") == 1
    assert "--ready-file" not in text  # for tests and launchers only


# --help a person can read (issue 29.7): groups from the declarations, sizes in units.

SIZED = [declared for declared in DECLARED if declared.metadata["kind"] == "bytes"]
ROUTER_SIZED = [d for d in ROUTER_DECLARED if d.metadata["kind"] == "bytes"]


def help_text(parse: Any, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as excinfo:
        parse(["--help"], {})
    assert excinfo.value.code == 0
    return capsys.readouterr().out


def sections(text: str) -> dict[str, str]:
    """``--help``'s sections by title (a line ending in ':' that starts a block)."""
    found: dict[str, str] = {}
    title = ""
    for line in text.splitlines():
        if line and not line.startswith(" ") and line.endswith(":"):
            title = line[:-1]
            found[title] = ""
        elif title:
            found[title] += line + "\n"
    return found


def test_a_setting_declared_without_a_group_fails_at_import_naming_its_flag() -> None:
    # What a merge that adds a flag without group= meets first: a clear error, not a
    # flag that --help lists nowhere.
    with pytest.raises(TypeError, match=r"setting --new-flag: group= is required, one of"):
        setting(1, flag="--new-flag", kind="int", help="something new")
    with pytest.raises(TypeError, match=r"got 'misc'"):
        setting(1, flag="--new-flag", kind="int", group="misc", help="something new")


@pytest.mark.parametrize(
    "declared", [*DECLARED, *ROUTER_DECLARED], ids=lambda d: d.metadata["flag"]
)
def test_every_declared_setting_names_a_known_group(declared: Field) -> None:
    assert declared.metadata["group"] in SETTING_GROUPS


@pytest.mark.parametrize(
    ("parse", "declared"),
    [(parse_server_args, DECLARED), (parse_router_args, ROUTER_DECLARED)],
    ids=["server", "router"],
)
def test_help_lists_each_option_under_its_declared_group_and_ends_with_examples(
    capsys: pytest.CaptureFixture[str], parse: Any, declared: list[Field]
) -> None:
    text = help_text(parse, capsys)
    shown = sections(text)
    for one in declared:
        flag, group = one.metadata["flag"], SETTING_GROUPS[one.metadata["group"]]
        if one.metadata["hidden"]:
            assert flag not in text
            continue
        assert group in shown, f"{flag}: no section {group!r}"
        assert re.search(rf"^  {re.escape(flag)}\b", shown[group], re.MULTILINE), flag
    examples = shown["examples"].strip().splitlines()
    assert len(examples) >= 3 and all(
        line.lstrip().startswith(("kcoral", "KCORAL")) for line in examples
    )


@pytest.mark.parametrize(
    "declared", [*DECLARED, *ROUTER_DECLARED], ids=lambda d: d.metadata["flag"]
)
def test_every_shown_option_says_what_it_does_in_words(declared: Field) -> None:
    # "clamp", "413 above" and "500 above" said nothing to a reader.
    if declared.metadata["hidden"]:
        return
    words = re.findall(r"[A-Za-z]{2,}", declared.metadata["help"])
    assert len(words) >= 4, (declared.metadata["flag"], declared.metadata["help"])


@pytest.mark.parametrize(
    ("parse", "declared"),
    [(parse_server_args, DECLARED), (parse_router_args, ROUTER_DECLARED)],
    ids=["server", "router"],
)
def test_help_shows_sizes_in_units_never_as_raw_byte_counts(
    capsys: pytest.CaptureFixture[str], parse: Any, declared: list[Field]
) -> None:
    text = " ".join(help_text(parse, capsys).split())
    assert "268435456 " not in text.replace("268435456.", "") and "16777216" not in text
    assert "(default 256 MiB)" in text
    for one in declared:
        if one.metadata["kind"] == "bytes" and not one.metadata["hidden"]:
            assert f"{one.metadata['flag']} SIZE " in text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("256M", 256 << 20),
        ("4G", 4 << 30),
        ("512K", 512 << 10),
        ("512k", 512 << 10),
        ("2GiB", 2 << 30),
        ("1000", 1000),
        ("0", 0),
    ],
)
def test_a_size_takes_k_m_or_g_binary_units_or_plain_bytes(text: str, expected: int) -> None:
    settings = parse_server_args(["--max-output-limit-bytes", text], {})
    assert settings.config.max_output_limit_bytes == expected


@pytest.mark.parametrize("declared", SIZED, ids=lambda d: d.metadata["flag"])
def test_every_size_setting_takes_a_unit_suffix_and_stays_an_integer(declared: Field) -> None:
    settings = parse_server_args([declared.metadata["flag"], "3M"], {})
    value = settings_value(settings, declared.name)
    assert value == 3 << 20 and type(value) is int


@pytest.mark.parametrize("declared", ROUTER_SIZED, ids=lambda d: d.metadata["flag"])
def test_every_router_size_option_takes_a_unit_suffix(declared: Field) -> None:
    assert getattr(parse_router_args([declared.metadata["flag"], "1G"], {}), declared.name) == (
        1 << 30
    )


@pytest.mark.parametrize("text", ["1.5G", "12X", "M", "-", "256 M", "1e6", "4GB", " 4G"])
def test_a_size_that_is_no_size_is_a_usage_error_naming_the_option(
    capsys: pytest.CaptureFixture[str], text: str
) -> None:
    message = refused(capsys, ["--max-request-bytes", text])
    assert "--max-request-bytes" in message and "invalid size" in message


@dataclass(frozen=True)
class _SizedFromTheEnvironment:
    """A size setting with a variable, as later issues may declare one."""

    limit_bytes: int = setting(
        1 << 20,
        flag="--limit-bytes",
        kind="bytes",
        group="requests",
        help="a size that a variable may give",
        env="KCORAL_TEST_LIMIT_BYTES",
    )


def _sized_from(argv: list[str], environ: dict[str, str]) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="test", exit_on_error=False)
    add_grouped_options(parser, declared_settings(_SizedFromTheEnvironment))
    resolve = _Resolver(parser, environ)
    return resolve.settings(_SizedFromTheEnvironment, parser.parse_args(argv))


def test_a_size_from_an_environment_variable_takes_units_too(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert _sized_from([], {"KCORAL_TEST_LIMIT_BYTES": "64M"}) == {"limit_bytes": 64 << 20}
    assert _sized_from(["--limit-bytes", "2K"], {"KCORAL_TEST_LIMIT_BYTES": "64M"}) == {
        "limit_bytes": 2048
    }
    with pytest.raises(SystemExit):
        _sized_from([], {"KCORAL_TEST_LIMIT_BYTES": "64X"})
    assert "KCORAL_TEST_LIMIT_BYTES: not a size" in capsys.readouterr().err


def test_the_spec_bounds_the_port_as_the_parser_does() -> None:
    # Issue 29.12: SERVER §2 said 1-65535 while EXTENSIONS §2 (and the parser) take 0.
    spec = (Path(__file__).resolve().parents[2] / "docs" / "spec" / "SERVER.md").read_text()
    row = next(line for line in spec.splitlines() if line.startswith("| `--port` "))
    assert "0–65535" in row
    assert parse_server_args(["--port", "0"], {}).port == 0
    assert parse_server_args(["--port", "65535"], {}).port == 65535
    with pytest.raises(SystemExit):
        parse_server_args(["--port", "65536"], {})
