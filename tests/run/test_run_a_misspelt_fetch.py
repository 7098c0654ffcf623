"""`kcoral run --fetch` of a path the tool did not write (CLIENT_API §11): the missing
output says what the directory it was looked for in holds, so a misspelt name shows the
one meant. It read `missing output reslts: not found` alone, and the user ran the tool
again to list its directory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from run_as_a_user import ServerWithAToken, kcoral_run, server_with_a_token

WRITES_RESULTS = (
    "import os; os.makedirs('results/plots'); open('results/loss.csv', 'w').write('1'); "
    "open('log.txt', 'w').write('ok')"
)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerWithAToken]:
    with server_with_a_token(tmp_path_factory.mktemp("misspelt-fetch")) as started:
        yield started


def test_a_misspelt_fetch_says_what_the_tools_directory_holds(
    server: ServerWithAToken, tmp_path: Path
) -> None:
    argv = ["python", "--fetch", "reslts", "--fetch", "results/los.csv", "--out", "got"]
    done = kcoral_run(server, *argv, "--", "-c", WRITES_RESULTS, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stderr.splitlines() == [
        "kcoral run: missing output reslts: not found; the tool's directory holds log.txt, "
        "results/",
        "kcoral run: missing output results/los.csv: not found; results/ holds loss.csv, plots/",
    ]
    assert not (tmp_path / "got").exists()


def test_a_missing_output_in_a_crowded_directory_names_the_first_few_and_counts_the_rest(
    server: ServerWithAToken, tmp_path: Path
) -> None:
    code = "for i in range(10): open(f'part{i}.txt', 'w')"
    argv = ["python", "--fetch", "part.txt", "--out", "got", "--", "-c", code]
    done = kcoral_run(server, *argv, cwd=tmp_path)
    assert done.returncode == 1, done.stderr
    assert done.stderr == (
        "kcoral run: missing output part.txt: not found; the tool's directory holds "
        "part0.txt, part1.txt, part2.txt, part3.txt, part4.txt, part5.txt and 4 more\n"
    )
