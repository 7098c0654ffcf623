"""``kcoral run python`` from another directory than the script's: an input keeps only its
own name (``--send w/bench`` arrives as ``bench``), so ``-- w/bench/main.py`` finds nothing
remotely. Against a real server: the refusal names the path the script arrives under, and
following it runs the script. Before, it said ``add --send w/bench/main.py``, and with that
added (the file then arriving as ``main.py``) it said the same again."""

from __future__ import annotations

from pathlib import Path

import pytest

from kcoral.cli import main as kcoral_main

pytestmark = pytest.mark.timeout(120)


def run(server_url: str, *args: str) -> int:
    return kcoral_main(["run", "python", "--url", server_url, *args])


def test_a_script_sent_under_another_name_is_refused_naming_that_name(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    (in_tmp / "w" / "bench").mkdir(parents=True)
    (in_tmp / "w" / "bench" / "main.py").write_text("print('ran main')\n")
    assert run(server_url, "--send", "w/bench", "--", "w/bench/main.py") == 2
    assert capfd.readouterr().err.strip() == (
        "kcoral run: python: w/bench/main.py is sent as bench/main.py (inputs keep only their "
        "own name): name it bench/main.py after '--'"
    )
    assert run(server_url, "--", "w/bench/main.py") == 2
    assert capfd.readouterr().err.strip() == (
        "kcoral run: python: w/bench/main.py was not sent (the tool runs remotely): add --send "
        "w/bench/main.py, which arrives as main.py"
    )
    assert run(server_url, "--send", "w/bench/main.py", "--", "w/bench/main.py") == 2
    assert capfd.readouterr().err.strip() == (
        "kcoral run: python: w/bench/main.py is sent as main.py (inputs keep only their own "
        "name): name it main.py after '--'"
    )
    assert run(server_url, "--send", "w/bench", "--", "bench/main.py") == 0
    assert capfd.readouterr().out == "ran main\n"


def test_a_script_named_without_the_folder_it_is_sent_in_is_refused_naming_its_path(
    server_url: str, in_tmp: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    # run soak: `--send bench -- main.py` said "main.py: no such file here, and no --send
    # input provides it", though bench/main.py was sent
    (in_tmp / "bench").mkdir()
    (in_tmp / "bench" / "main.py").write_text("print('ran main')\n")
    assert run(server_url, "--send", "bench", "--", "main.py") == 2
    assert capfd.readouterr().err.strip() == (
        "kcoral run: python: main.py: no --send input arrives as main.py, but bench/main.py "
        "does: name it bench/main.py after '--'"
    )
