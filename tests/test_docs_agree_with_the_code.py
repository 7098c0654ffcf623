"""What the README and docs/ tell a newcomer to type agrees with the code: each option a
``kcoral server``, ``kcoral router``, ``kcoral run`` or ``%kcoral``/``%%kcoral`` line in them
names is one that command has; the browser test's screenshots are refreshed, and the fuzz
count is given, the way the docs say. No server is started: the parsers are asked, as
``--help`` asks them."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from kcoral_jupyter.magics.options import cell_parser, line_parsers
from kcoral_jupyter.server_extension import KCoralExtension
from kcoral_jupyter.settings import KCoral
from kcoral_server.router.settings import _build_parser as build_router_parser
from kcoral_server.settings.command_line import build_server_parser

from kcoral.run.arguments import _VALUE_OPTIONS

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
EXAMPLES = sorted((ROOT / "examples").glob("*.py"))
OPTION = re.compile(r"(?<![\w-])(--[a-z][a-z0-9-]+)")
#: ``kcoral COMMAND ...`` up to the end of its code span or table cell
COMMAND_LINE = re.compile(r"kcoral (server|router|run)\b([^`|\n]*)")
#: ``%kcoral ...`` or ``%%kcoral ...`` likewise
MAGIC_LINE = re.compile(r"%%?kcoral\b([^`|\n]*)")


def option_strings(parser) -> set[str]:
    return {name for action in parser._actions for name in action.option_strings}


def known_options() -> dict[str, set[str]]:
    return {
        "server": option_strings(build_server_parser()),
        "router": option_strings(build_router_parser()),
        "run": {*_VALUE_OPTIONS, "--gpus", "--help", "-h"},
        # --help after any command or on a cell line is the magics' own (not argparse's)
        "magic": {
            "--help",
            *option_strings(cell_parser()),
            *(name for parser in line_parsers().values() for name in option_strings(parser)),
        },
    }


def shown_command_lines() -> list[tuple[str, str, str]]:
    """(where, command, its options) of each ``kcoral server|router|run`` line shown, and of
    each ``%kcoral``/``%%kcoral`` line (command ``magic``); a ``kcoral run`` line's options
    end at its first ``--`` (the tool's own follow)."""
    found = []
    for path in DOCS + EXAMPLES:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            where = f"{path.relative_to(ROOT)}:{number}"
            for match in COMMAND_LINE.finditer(line):
                command, rest = match.groups()
                if command == "run":
                    rest = rest.split(" -- ")[0]
                found += [(where, command, option) for option in OPTION.findall(rest)]
            for match in MAGIC_LINE.finditer(line):
                found += [(where, "magic", option) for option in OPTION.findall(match[1])]
    return found


def test_the_docs_show_kcoral_command_lines_at_all() -> None:
    commands = {command for _, command, _ in shown_command_lines()}
    assert commands == {"server", "router", "run", "magic"}, commands


def test_every_option_a_docs_command_line_names_is_one_that_command_has() -> None:
    known = known_options()
    unknown = [
        f"{where}: {'%kcoral' if command == 'magic' else 'kcoral ' + command} {option}"
        for where, command, option in shown_command_lines()
        if option not in known[command]
    ]
    assert not unknown, "\n".join(unknown)


@pytest.mark.parametrize("page", ["README.md", "docs/jupyterlab.md"])
def test_the_docs_refresh_the_screenshots_with_the_variable_the_browser_test_reads(
    page: str,
) -> None:
    # docs/jupyterlab.md said the browser test writes them into docs/screenshots/; since
    # tests stopped writing into tracked files, only this variable makes it do so.
    browser_test = (ROOT / "tests" / "labextension" / "test_browser.py").read_text()
    variable = re.search(r'SCREENSHOT_DIR_ENV = "(\w+)"', browser_test)
    assert variable is not None
    words = " ".join((ROOT / page).read_text(encoding="utf-8").split())
    refresh = f"{variable[1]}=docs/screenshots python -m pytest tests/labextension/test_browser.py"
    assert refresh in words
    assert "writes the screenshots above to `docs/screenshots/`" not in words


@pytest.mark.parametrize("page", ["README.md", "docs/reliability.md"])
def test_the_docs_give_the_fuzz_count_as_the_line_the_reliability_suite_prints(page: str) -> None:
    # docs/reliability.md gave "2,622 generated requests per CI run", a count the suite
    # neither fixes nor checks; it prints the count of each run in this line.
    suite = (ROOT / "tests" / "reliability" / "conftest.py").read_text(encoding="utf-8")
    printed = re.search(r'f"fuzz: \{[^}]+\} (generated requests sent to a live server)', suite)
    assert printed is not None
    words = (ROOT / page).read_text(encoding="utf-8")
    assert f"`fuzz: N {printed[1]}`" in words
    assert "2,622" not in words


def test_the_readme_names_every_notebook_setting_in_its_notebooks_section() -> None:
    # It named url alone in its "Settings:" (and a few others in passing): token, timeout,
    # quiet and use_jobs were nowhere, though the refusal of a token says %config KCoral.token.
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    start = readme.index("## Notebooks: `%%kcoral`")
    section = readme[start : readme.index("\n## ", start + 1)]
    settings = " ".join(section[section.index("Settings: ") :].split())
    spelled = {name: (f"`{name}`", f"KCoral.{name} ") for name in KCoral.class_traits(config=True)}
    unnamed = [name for name, ways in spelled.items() if not any(w in settings for w in ways)]
    assert not unnamed, unnamed


@pytest.mark.parametrize("page", ["README.md", "docs/jupyterlab.md"])
def test_the_docs_name_every_setting_of_the_jupyter_server_extension(page: str) -> None:
    # request_timeout, the 10 s after which a server that never answers is shown as
    # "no answer from ... within 10 s", was named nowhere.
    words = (ROOT / page).read_text(encoding="utf-8")
    unnamed = [
        name
        for name in KCoralExtension.class_traits(config=True)
        if f"c.KCoralExtension.{name}" not in words
    ]
    assert not unnamed, unnamed
