"""Argument rules of the five ``kcoral run`` tools (CLIENT_API.md §11).

Everything here is pure: it looks only at the words after the first ``--`` and raises
``UsageError`` for a command line the tool would refuse, so usage errors never reach a server.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass


class UsageError(ValueError):
    """An invalid ``kcoral run`` command line (exit status 2, no server contacted)."""


@dataclass(frozen=True)
class Tool:
    """What the command line of one tool may contain and how its outputs come back."""

    name: str
    synopsis: str
    description: str
    #: ``--fetch`` is offered (ncu and run-iket return their own output directory instead)
    allows_fetch: bool
    #: ``--out`` is mandatory (the tool always produces files)
    requires_out: bool


TOOLS: dict[str, Tool] = {
    tool.name: tool
    for tool in (
        Tool(
            "python",
            "[python options] SCRIPT | -m MODULE | -c CODE [args]",
            "Run the worker's Python interpreter. A script, -m or -c is required (--version "
            "and -h run alone); -i and reading the program from stdin (-) are refused.",
            allows_fetch=True,
            requires_out=False,
        ),
        Tool(
            "ncu",
            "[ncu options] -- APP [args]",
            "Profile APP with Nsight Compute; the report arrives as OUT/capture.ncu-rep. "
            "--out is required; --export/-o, --import/-i, --mode, --config-file and "
            "--config-file-path are refused.",
            allows_fetch=False,
            requires_out=True,
        ),
        Tool(
            "run-iket",
            "profile [options] -- APP [args]",
            "Profile APP with run-iket; every file it writes comes back under OUT. --out is "
            "required; --output-dir/-o and --working-dir are refused.",
            allows_fetch=False,
            requires_out=True,
        ),
        Tool(
            "compute-sanitizer",
            "[sanitizer options] APP [args]",
            "Run APP under compute-sanitizer, arguments unchanged.",
            allows_fetch=True,
            requires_out=False,
        ),
        Tool(
            "shell",
            "EXECUTABLE [args]",
            "Run EXECUTABLE directly (no shell is inserted). A path containing '/' is "
            "relative to the uploaded inputs; a bare name is looked up on the worker's PATH.",
            allows_fetch=True,
            requires_out=False,
        ),
    )
}

# Python options that consume a value (attached or as the next word).
_PYTHON_VALUE_SHORT = frozenset("WX")
_PYTHON_VALUE_LONG = frozenset({"--check-hash-based-pycs"})

_NCU_REFUSED_LONG = ("--export", "--import", "--mode", "--config-file", "--config-file-path")
_NCU_REFUSED_SHORT = ("-o", "-i")
_IKET_REFUSED_LONG = ("--output-dir", "--working-dir")
_IKET_REFUSED_SHORT = ("-o",)


def get_tool(name: str) -> Tool:
    """The tool called ``name``; ``UsageError`` listing the tools otherwise."""
    try:
        return TOOLS[name]
    except KeyError:
        pass
    choices = f"choose from {', '.join(TOOLS)}"
    if _PROGRAM_NAME.fullmatch(name):
        # `kcoral run nsys ...` or `kcoral run torchrun ...`: any installed program runs
        # through shell, which the list alone did not say
        choices += f"; any other program runs through shell: kcoral run shell -- {name} ..."
    raise UsageError(f"unknown tool {name!r} ({choices})")


#: a word that names a program to run (nsys, torchrun, python3.12), as shell runs one
_PROGRAM_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9._+-]*", re.ASCII)


def check_tool_args(tool: Tool, args: Sequence[str]) -> None:
    """Raise ``UsageError`` unless ``args`` (the words after the first ``--``) suit ``tool``."""
    if not args:
        raise UsageError(f"nothing to run after '--' (usage: {tool.name} {tool.synopsis})")
    if tool.name == "python":
        check_python_args(args)
    elif tool.name == "ncu":
        options = _split_at_second_separator("ncu", args)
        _refuse_options("ncu", options, _NCU_REFUSED_LONG, _NCU_REFUSED_SHORT)
    elif tool.name == "run-iket":
        if args[0] != "profile":
            raise UsageError("run-iket: the first argument must be 'profile'")
        options = _split_at_second_separator("run-iket", args[1:])
        _refuse_options("run-iket", options, _IKET_REFUSED_LONG, _IKET_REFUSED_SHORT)
    elif tool.name == "compute-sanitizer" or tool.name == "shell":
        if not args[0]:
            raise UsageError(f"{tool.name}: the executable name is empty")


#: python's options that print something and exit before any program is read: `kcoral
#: run python -- --version`, the remote interpreter's version, was refused for want of a
#: script
_PYTHON_INFORMATION_LONG = frozenset(
    {"--version", "--help", "--help-env", "--help-xoptions", "--help-all"}
)
_PYTHON_INFORMATION_SHORT = "Vh?"


def check_python_args(args: Sequence[str]) -> str | None:
    """Walk python's own options the way the interpreter does, up to the program to run;
    the script's path as typed (``None`` for ``-c``/``-m``)."""
    index = 0
    while index < len(args):
        word = args[index]
        if word == "-":
            raise UsageError("python: reading the program from stdin ('-') is refused")
        if word == "--":
            # python treats the word after '--' as the script, whatever it looks like
            if index + 1 >= len(args):
                raise UsageError("python: a script, -m MODULE or -c CODE is required")
            if args[index + 1] == "-":
                raise UsageError("python: reading the program from stdin ('-') is refused")
            return args[index + 1]
        if word.startswith("--"):
            name = word.split("=", 1)[0]
            if name in _PYTHON_INFORMATION_LONG:
                return None  # prints and exits: no program to run
            if name in _PYTHON_VALUE_LONG and "=" not in word:
                index += 1
                if index >= len(args):
                    raise UsageError(f"python: option {name} needs a value")
            index += 1
            continue
        if not word.startswith("-"):
            return word  # the script
        letters = word[1:]
        for position, letter in enumerate(letters):
            if letter == "i":
                raise UsageError("python: interactive mode (-i) is refused")
            if letter in _PYTHON_INFORMATION_SHORT:
                return None  # -V, -h: prints and exits, as --version does
            if letter in "cm":
                if position + 1 == len(letters) and index + 1 >= len(args):
                    raise UsageError(f"python: option -{letter} needs a value")
                return None
            if letter in _PYTHON_VALUE_SHORT:
                if position + 1 == len(letters):
                    index += 1
                    if index >= len(args):
                        raise UsageError(f"python: option -{letter} needs a value")
                break
        index += 1
    raise UsageError("python: a script, -m MODULE or -c CODE is required")


def _split_at_second_separator(tool: str, args: Sequence[str]) -> Sequence[str]:
    """The tool's own options: the words before the (required) second ``--``."""
    try:
        separator = list(args).index("--")
    except ValueError:
        raise UsageError(f"{tool}: a second '--' before the application is required") from None
    if separator + 1 >= len(args):
        raise UsageError(f"{tool}: an application is required after the second '--'")
    return args[:separator]


def _refuse_options(
    tool: str, options: Sequence[str], refused_long: Sequence[str], refused_short: Sequence[str]
) -> None:
    for word in options:
        if word.startswith("--") and len(word) > 2:
            name = word.split("=", 1)[0]
            # The tools accept unambiguous prefixes of long options, so a prefix of a refused
            # option may select it; refuse those too.
            for refused in refused_long:
                if refused.startswith(name):
                    raise UsageError(f"{tool}: option {refused} is managed by kcoral run")
        elif word.startswith("-") and not word.startswith("--"):
            for refused in refused_short:
                if word.startswith(refused):
                    raise UsageError(f"{tool}: option {refused} is managed by kcoral run")
