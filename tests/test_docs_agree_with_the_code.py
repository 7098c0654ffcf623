"""What the README and docs/ tell a newcomer to type agrees with the code: each option a
``kcoral server``, ``kcoral router``, ``kcoral run`` or ``%kcoral``/``%%kcoral`` line in them
names is one that command has; the browser test's screenshots are refreshed, and the fuzz
count is given, the way the docs say. No server is started: the parsers are asked, as
``--help`` asks them."""

from __future__ import annotations

import builtins
import contextlib
import importlib
import inspect
import io
import json
import re
import shlex
import subprocess
import symtable
import sys
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


#: "`--flag` ... (default 60" or "`--flag N` (default 1 GiB" in running text
DOCS_DEFAULT = re.compile(r"`(--[a-z][a-z0-9-]+)(?: [^`]*)?`[^`(]{0,60}?\(default:? (\d[^;),]*)")


def help_defaults(parser) -> dict[str, str]:
    """Each option's default as its ``--help`` line words it: ``(default 4 GiB)`` → ``4 GiB``."""
    formatter = parser._get_formatter()
    found = {}
    for action in parser._actions:
        words = " ".join(formatter._expand_help(action).split()) if action.help else ""
        if shown := re.search(r"\(default:? ([^;)]*)", words):
            found.update(dict.fromkeys(action.option_strings, shown[1]))
    return found


def test_every_number_the_docs_give_as_an_options_default_is_the_one_its_help_gives() -> None:
    # A guard: each default written beside a `kcoral server`/`kcoral router` option in the
    # README and docs/ (`--session-idle-seconds` (default 600), ...) is the parser's.
    helped = {**help_defaults(build_router_parser()), **help_defaults(build_server_parser())}
    checked, wrong = 0, []
    for path in DOCS:
        words = " ".join(path.read_text(encoding="utf-8").split())
        for option, written in DOCS_DEFAULT.findall(words):
            if option in helped:
                checked += 1
                if not written.startswith(helped[option]):
                    wrong.append(
                        f"{path.relative_to(ROOT)}: {option} (default {written}): "
                        f"--help says {helped[option]}"
                    )
    assert checked, "the docs give no option's default at all"
    assert not wrong, "\n".join(wrong)


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


def test_the_magics_help_names_every_notebook_setting() -> None:
    # The README sends readers to `%kcoral --help` "for all of it", but its Settings line
    # named neither use_jobs nor the embedded server's local_args and local_start_timeout.
    from kcoral_jupyter.magics.options import help_text

    text = help_text()
    settings = text[text.index("Settings: ") :]
    named = set(re.findall(r"\b\w+\b", settings))
    unnamed = [name for name in KCoral.class_traits(config=True) if name not in named]
    assert not unnamed, unnamed


def test_every_kcoral_setting_the_docs_and_the_notebook_messages_name_is_one() -> None:
    # A guard: `%config KCoral.X` in the README, docs/, the notebooks, or a message the
    # magics print (`KCoral.local_start_timeout`, `KCoral.token`) names a setting that exists.
    sources = [
        *DOCS,
        *sorted((ROOT / "notebooks").glob("*.ipynb")),
        *sorted((ROOT / "jupyter_ext" / "kcoral_jupyter").rglob("*.py")),
    ]
    settings = set(KCoral.class_traits(config=True))
    named = {
        (f"KCoral.{name}", path.relative_to(ROOT))
        for path in sources
        for name in re.findall(r"\bKCoral\.(\w+)", path.read_text(encoding="utf-8"))
    }
    assert len(named) > 10, named
    unknown = sorted(f"{path}: {said}" for said, path in named if said[7:] not in settings)
    assert not unknown, unknown


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


@pytest.mark.parametrize("page", ["README.md", "docs/jupyterlab.md"])
def test_the_docs_name_every_jupyterlab_setting_with_the_default_its_schema_gives(
    page: str,
) -> None:
    # A guard: the Settings line ("`pollInterval` (seconds, default 3) and `statusServer`")
    # and the settings schema JupyterLab reads are written apart.
    schema = json.loads((ROOT / "labextension" / "schema" / "plugin.json").read_text())
    words = " ".join((ROOT / page).read_text(encoding="utf-8").split())
    settings = words[words.index("**Settings** (Settings → KCoral)") :][:400]
    wrong = []
    for name, setting in schema["properties"].items():
        said = settings[settings.find(f"`{name}`") :] if f"`{name}`" in settings else ""
        default = setting.get("default")
        if not said:
            wrong.append(f"{name} is not named")
        elif default not in ("", None) and f"default {default})" not in said:
            wrong.append(f"{name}: its default {default} is not given")
    assert not wrong, wrong


@pytest.mark.parametrize("page", ["README.md", "docs/jupyterlab.md"])
def test_the_docs_show_a_cell_whose_kernel_restarted_naming_its_job_once(page: str) -> None:
    # docs/jupyterlab.md showed "(last: running 2 min 10 s · job 46593a1b); job 4659… may
    # still run", but the extension drops the live line's "· job" from what it quotes
    # (restarts.ts), so the line names its job once, as the README showed it.
    restarts = (ROOT / "labextension" / "src" / "restarts.ts").read_text(encoding="utf-8")
    assert "last = last.split(` \\u00b7 job ${place.jobId.slice(0, 8)}`).join('');" in restarts
    words = " ".join((ROOT / page).read_text(encoding="utf-8").split())
    quoted = re.findall(r"while this cell ran \(last: ([^)]*)\); job ", words)
    assert quoted, "the page shows no line of a cell whose kernel restarted"
    assert not [last for last in quoted if " · job " in last], quoted


#: a fenced block of Python, or of shell commands, in a page
PYTHON_BLOCK = re.compile(r"^```(?:python|py)\n(.*?)^```", re.MULTILINE | re.DOTALL)
SHELL_BLOCK = re.compile(r"^```(?:bash|sh|shell|console)\n(.*?)^```", re.MULTILINE | re.DOTALL)
#: the guide pages, whose snippets are each run as they stand (the README's tour and the
#: specs' signature listings build on what came before)
GUIDE_PAGES = sorted((ROOT / "docs").glob("*.md"))


def blocks(pattern: re.Pattern[str], pages: list[Path]) -> list[tuple[str, str]]:
    """(where, text) of each block ``pattern`` finds in ``pages``."""
    found = []
    for path in pages:
        text = path.read_text(encoding="utf-8")
        for match in pattern.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            found.append((f"{path.relative_to(ROOT)}:{line}", match[1]))
    return found


def as_python(snippet: str) -> str:
    """A notebook snippet as the kernel runs it (``%%kcoral`` and ``%kcoral`` lines too)."""
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager().transform_cell(snippet)


def names_read_but_never_bound(source: str) -> set[str]:
    """The global names ``source`` reads that it neither binds nor imports, builtins aside:
    what a reader pasting it alone meets as a ``NameError``."""
    module = symtable.symtable(source, "<snippet>", "exec")
    bound = {s.get_name() for s in module.get_symbols() if s.is_assigned() or s.is_imported()}
    read: set[str] = set()
    tables = [module]
    while tables:
        table = tables.pop()
        tables += table.get_children()
        read |= {
            s.get_name()
            for s in table.get_symbols()
            if s.is_referenced() and (table is module or s.is_global())
        }
    return read - bound - set(dir(builtins)) - {"get_ipython"}


def test_every_python_snippet_of_the_readme_and_the_guides_compiles() -> None:
    broken = []
    for where, snippet in blocks(PYTHON_BLOCK, [ROOT / "README.md", *GUIDE_PAGES]):
        try:
            compile(as_python(snippet), where, "exec")
        except SyntaxError as exc:
            broken.append(f"{where}: {exc}")
    assert not broken, "\n".join(broken)


def test_a_guide_pages_python_snippet_runs_pasted_alone() -> None:
    # docs/jobs.md's snippet submitted `program`, which nothing in it made: pasted as the
    # page says, it ended in NameError: name 'program' is not defined.
    unbound = [
        f"{where}: {sorted(names)}"
        for where, snippet in blocks(PYTHON_BLOCK, GUIDE_PAGES)
        if (names := names_read_but_never_bound(as_python(snippet)))
    ]
    assert blocks(PYTHON_BLOCK, GUIDE_PAGES), "the guides show no Python at all"
    assert not unbound, "\n".join(unbound)


def shell_words(rest: str) -> list[str]:
    """A command's words up to its first shell operator (``>``, ``&``, ``|``, ``;``)."""
    lexer = shlex.shlex(rest, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    words = []
    for word in lexer:
        if set(word) <= set("&|;<>()"):
            break
        words.append(word)
    return words


def test_every_kcoral_server_and_router_command_in_a_shell_block_parses() -> None:
    parsers = {"server": build_server_parser(), "router": build_router_parser()}
    shown, refused = 0, []
    for where, block in blocks(SHELL_BLOCK, DOCS):
        for line in block.replace("\\\n", " ").splitlines():
            for match in re.finditer(r"(?:^|[\s;&|(])kcoral (server|router)\b(.*)", line):
                command, rest = match.groups()
                words, shown = shell_words(rest), shown + 1
                message = io.StringIO()
                try:
                    with contextlib.redirect_stderr(message):
                        parsers[command].parse_args(words)
                except SystemExit:
                    refused.append(f"{where}: kcoral {command} {rest}: {message.getvalue()}")
    assert shown, "no kcoral server or router command in any shell block"
    assert not refused, "\n".join(refused)


def test_every_kcoral_run_command_the_docs_show_names_its_tool_before_its_options() -> None:
    # docs/scaling.md told a reader to add `kcoral run --select gpu=a100 ...`, which kcoral
    # run refuses: "option --select before the tool: the tool comes first". A span that
    # only names an option (`kcoral run --send`) is no command and passes.
    shown, misordered = 0, []
    for path in DOCS:
        text = path.read_text(encoding="utf-8")
        spans = re.findall(r"`(kcoral run\b[^`]*)`", text)
        spans += [line for _, block in blocks(SHELL_BLOCK, [path]) for line in block.splitlines()]
        for span in spans:
            for match in re.finditer(r"kcoral run((?: +[^ ;|&]+)*)", " ".join(span.split())):
                words = match[1].split()
                shown += 1
                if len(words) > 1 and words[0].startswith("-") and words[0] not in ("-h", "--help"):
                    misordered.append(f"{path.relative_to(ROOT)}: {match[0]}")
    assert shown, "the docs show no kcoral run command"
    assert not misordered, "\n".join(misordered)


#: a name in backticks that reads as an exception's: `TransportError`, `kcoral.X`
EXCEPTION_NAME = re.compile(r"`((?:\w+\.)*[A-Z]\w*(?:Error|Exception|TooLarge|Interrupt))`")


def catchable(name: str) -> bool:
    """Is ``name`` a class a reader's ``except`` finds as written: a builtin, one of
    ``kcoral``'s names, a notebook error (``kcoral_jupyter.cell_errors``), or a dotted path
    that imports?"""
    from kcoral_jupyter import cell_errors

    import kcoral

    module, _, last = name.rpartition(".")
    if not module:
        return any(hasattr(where, last) for where in (builtins, kcoral, cell_errors))
    try:
        return isinstance(getattr(importlib.import_module(module), last, None), type)
    except ImportError:
        return False


def test_every_exception_the_readme_and_the_guides_name_is_one_a_reader_can_catch() -> None:
    # The README said a body over the server's limit is refused unsent with
    # `RequestTooLarge`, which `kcoral` has no name for (AttributeError in an except).
    pages = [ROOT / "README.md", *(page for page in GUIDE_PAGES if page.name != "architecture.md")]
    named = {
        (name, page.relative_to(ROOT))
        for page in pages
        for name in EXCEPTION_NAME.findall(page.read_text(encoding="utf-8"))
    }
    assert named, "the docs name no exception at all"
    uncatchable = [f"{page}: {name}" for name, page in sorted(named) if not catchable(name)]
    assert not uncatchable, uncatchable


SCRIPT_LINE = re.compile(r"python3? ((?:benchmarks|examples)/\w+\.py)([^`|\n]*)")


def test_every_option_a_docs_line_gives_a_benchmark_or_example_script_is_in_its_help() -> None:
    # docs/reliability.md's `python benchmarks/soak.py [--requests N] [--json report.json]`,
    # docs/jobs.md's benchmark and the README's examples: each option shown is one the
    # script's --help lists.
    shown: dict[str, set[str]] = {}
    for path in DOCS:
        for match in SCRIPT_LINE.finditer(path.read_text(encoding="utf-8")):
            shown.setdefault(match[1], set()).update(OPTION.findall(match[2]))
    assert "benchmarks/soak.py" in shown
    unknown = []
    for script, options in sorted(shown.items()):
        helped = subprocess.run(
            [sys.executable, str(ROOT / script), "--help"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        unknown += [f"{script} {option}" for option in options if option not in helped.stdout]
    assert not unknown, unknown


@pytest.mark.parametrize("page", ["README.md", "docs/remote_functions.md"])
def test_a_page_names_as_plain_calls_exactly_the_async_clients_members_that_are_no_coroutines(
    page: str,
) -> None:
    # Both said "mirrors `Client` with coroutines (...)" over a list holding `function`,
    # `job` and `session`: `await client.job(id)` ends in TypeError.
    from kcoral import AsyncClient

    text = " ".join((ROOT / page).read_text(encoding="utf-8").split())
    opening = "`kcoral.AsyncClient(url)` mirrors `Client` ("
    start = text.index(opening) + len(opening)
    listing = text[start : text.index(")", start)]
    listed, _, plain = listing.partition("but the three that send nothing")
    members = [name for name in re.findall(r"`(\w+)`", listed) if name != "async"]
    not_awaited = {
        name for name in members if not inspect.iscoroutinefunction(getattr(AsyncClient, name))
    }
    assert set(re.findall(r"`(\w+)`", plain)) == not_awaited == {"function", "job", "session"}


@pytest.mark.parametrize("page", ["README.md", "docs/reliability.md"])
def test_the_docs_say_the_fuzz_variable_sets_each_propertys_examples_as_the_suite_reads_it(
    page: str,
) -> None:
    # They said `KCORAL_FUZZ_EXAMPLES=N` "scales every property"; the suite runs N examples
    # of each in place of its own count, and named 13 security checks where it had 16.
    support = (ROOT / "tests" / "reliability" / "reliability_support.py").read_text()
    assert "return FUZZ_EXAMPLES or default" in support
    words = " ".join((ROOT / page).read_text(encoding="utf-8").split())
    assert "`KCORAL_FUZZ_EXAMPLES=N` runs N examples of every property" in words
    assert "13 security checks" not in words


@pytest.mark.parametrize("page", ["README.md", "docs/remote_functions.md"])
def test_the_remote_function_pages_say_how_generators_and_an_async_clients_functions_behave(
    page: str,
) -> None:
    # Neither page said either (remote soak): a generator met a TypeError at decoration the
    # pages never mentioned, and `await f.remote(x)` on an AsyncClient's function blocked
    # the loop, ran the call, then failed "object int can't be used in 'await' expression".
    from kcoral import AsyncClient
    from kcoral.remote import RemoteFunction

    def numbers() -> object:
        yield 1

    with pytest.raises(TypeError, match="return a list"):
        RemoteFunction(numbers, client=AsyncClient("http://127.0.0.1:9"))
    assert not inspect.iscoroutinefunction(RemoteFunction.remote)  # blocks unless run_async
    words = " ".join((ROOT / page).read_text(encoding="utf-8").split())
    assert "Generator functions are refused when decorating (`TypeError`: return a list)" in words
    assert (
        "A function an `AsyncClient` decorated is called the same way: `f.remote(...)` blocks "
        "and returns the value (so `await f.remote(...)` runs the call, then raises `TypeError`)"
    ) in words
