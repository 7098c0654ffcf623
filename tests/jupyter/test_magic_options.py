"""``%kcoral --help`` is rendered from the parsers that read the commands (issue 30.5):
every command and option a parser accepts is in the help, and a group's usage comes from
its commands' parsers."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError
from kcoral_jupyter.magics.options import HELP, cell_parser, group_usage, line_parsers


def test_every_command_and_option_the_parsers_accept_is_in_the_help() -> None:
    for parser in [cell_parser(), *line_parsers().values()]:
        assert parser.usage_line() in HELP
    for option in ("--gpus", "--return-folder", "--bench-label", "--keep", "--idle"):
        assert option in HELP


def test_a_group_usage_lists_each_subcommand_as_its_parser_has_it() -> None:
    usage = group_usage("session", line_parsers())
    assert usage.startswith(
        "%kcoral session start [--gpus N] [--idle SECONDS] [--keep] [--select SELECTOR] | stop"
    )
    assert "attach SESSION_ID | list" in usage


def test_a_parse_error_is_a_usage_error_naming_the_command() -> None:
    with pytest.raises(UsageError, match=r"^%kcoral session start: .*--gpu"):
        line_parsers()["session start"].parse(["--gpu", "1"])
    with pytest.raises(UsageError, match="LINES is a positive whole number"):
        line_parsers()["local log"].parse(["0"])


def test_a_malformed_select_is_a_usage_error_and_a_good_one_is_made_canonical() -> None:
    cell, start = cell_parser(), line_parsers()["session start"]
    for parser, prog in ((cell, "%%kcoral"), (start, "%kcoral session start")):
        for bad, why in (
            ("gpu", "must be key=value"),
            ("GPU=h100", "selector key 'GPU'"),
            ("gpu=h100,gpu=a100", "twice"),
            ("gpus=two", "whole number"),
            ("", "must be key=value"),
        ):
            with pytest.raises(UsageError, match=rf"^{prog}: argument --select: .*{why}"):
                parser.parse(["--select", bad])
        assert parser.parse(["--select", "pool=big, gpu=h100"]).select == "gpu=h100,pool=big"
        assert parser.parse([]).select is None
    assert "--select SELECTOR" in HELP and "gpus=N: at least N" in " ".join(HELP.split())
