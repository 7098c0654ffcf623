"""Argument rules of the five tools (CLIENT_API §11), checked without any server."""

from __future__ import annotations

import pytest

from kcoral.run.tools import TOOLS, UsageError, check_tool_args, get_tool


def check(tool: str, *args: str) -> None:
    check_tool_args(get_tool(tool), list(args))


@pytest.mark.parametrize(
    "args",
    [
        ["script.py"],
        ["script.py", "-i", "-"],
        ["-c", "print(1)"],
        ["-cprint(1)"],
        ["-m", "json.tool"],
        ["-mjson.tool"],
        ["-u", "-B", "script.py"],
        ["-uB", "script.py"],
        ["-W", "ignore", "script.py"],
        ["-Wi", "script.py"],
        ["-X", "importtime", "-c", "pass"],
        ["--check-hash-based-pycs", "always", "script.py"],
        ["--", "-odd-name.py"],
    ],
)
def test_python_accepts_a_script_a_module_or_code(args: list[str]) -> None:
    check("python", *args)


@pytest.mark.parametrize(
    "args",
    [["--version"], ["-V"], ["-VV"], ["-u", "-V"], ["-h"], ["--help"], ["--help-env"],
     ["--help-all"]],
)  # fmt: skip
def test_python_options_that_print_and_exit_need_no_program(args: list[str]) -> None:
    # `kcoral run python -- --version` (the remote interpreter's version) was refused:
    # "python: a script, -m MODULE or -c CODE is required"
    check("python", *args)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["-i", "script.py"], "interactive"),
        (["-ui", "script.py"], "interactive"),
        (["-"], "stdin"),
        (["-u", "-"], "stdin"),
        (["--", "-"], "stdin"),
        (["-u"], "required"),
        (["-W", "ignore"], "required"),
        (["-c"], "needs a value"),
        (["-m"], "needs a value"),
        (["-W"], "needs a value"),
    ],
)
def test_python_refuses_interactive_stdin_and_missing_programs(
    args: list[str], message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        check("python", *args)


def test_ncu_needs_a_second_separator_and_an_application() -> None:
    check("ncu", "--set", "full", "--", "python", "app.py")
    with pytest.raises(UsageError, match="second '--'"):
        check("ncu", "python", "app.py")
    with pytest.raises(UsageError, match="application"):
        check("ncu", "--set", "full", "--")


@pytest.mark.parametrize(
    "option",
    [
        "--export",
        "--export=x",
        "--exp",
        "-o",
        "-ofile",
        "--import",
        "-i",
        "--mode",
        "--mo",
        "--config-file",
        "--config-file-path=/x",
        "--config",
    ],
)
def test_ncu_refuses_the_options_kcoral_run_manages_and_their_abbreviations(
    option: str,
) -> None:
    with pytest.raises(UsageError, match="managed by kcoral run"):
        check("ncu", option, "--", "app")


def test_ncu_options_after_the_second_separator_belong_to_the_application() -> None:
    check("ncu", "--", "app", "-o", "--export", "x")


def test_run_iket_needs_profile_and_a_second_separator() -> None:
    check("run-iket", "profile", "--", "app")
    with pytest.raises(UsageError, match="profile"):
        check("run-iket", "--", "app")
    with pytest.raises(UsageError, match="second '--'"):
        check("run-iket", "profile", "app")


@pytest.mark.parametrize("option", ["--output-dir", "--output-dir=x", "-o", "-ox", "--working-dir"])
def test_run_iket_refuses_output_and_working_directories(option: str) -> None:
    with pytest.raises(UsageError, match="managed by kcoral run"):
        check("run-iket", "profile", option, "--", "app")


def test_shell_and_compute_sanitizer_take_their_arguments_unchanged() -> None:
    check("shell", "./bin/tool", "-i", "-o", "--export")
    check("compute-sanitizer", "--tool", "memcheck", "app")


def test_every_tool_refuses_an_empty_argument_list() -> None:
    for tool in TOOLS:
        with pytest.raises(UsageError, match="nothing to run"):
            check(tool)


def test_an_unknown_tool_is_a_usage_error() -> None:
    with pytest.raises(UsageError, match="unknown tool"):
        get_tool("bash")


def test_the_python_help_says_which_options_run_without_a_program() -> None:
    assert "A script, -m or -c is required (--version and -h run alone)" in (
        get_tool("python").description
    )
