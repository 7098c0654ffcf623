"""A ``%%kcoral`` path option whose workspace path breaks the protocol's rules, in the shell
of the Jupyter tests (real CPU server): the one-line refusal names the option. Before,
``--return-folder ../up`` and ``--file x:../y`` both read ``%%kcoral: path '../y' must not
contain a '..' component``, which did not say which option's path it was; a return path
given twice read ``return key 'file:a' is already used in this program``, the magic's own
key, and an empty local path (``--folder :x``) named no option."""

from __future__ import annotations

from pathlib import Path

import pytest
from IPython.core.error import UsageError


@pytest.mark.parametrize(
    ("option", "path"), [("--return-folder", "../up"), ("--return-file", "a/../../b")]
)
def test_a_return_path_that_climbs_out_is_refused_naming_its_option(
    shell, option: str, path: str
) -> None:
    with pytest.raises(UsageError) as refused:
        shell.run_cell_magic("kcoral", f"{option} {path}", "1\n")
    assert str(refused.value) == (
        f"%%kcoral: {option}: path {path!r} must not contain a '..' component"
    )


def test_an_upload_destination_that_climbs_out_is_refused_naming_its_option(
    shell, tmp_path: Path
) -> None:
    local = tmp_path / "x.txt"
    local.write_text("x")
    (tmp_path / "folder").mkdir()
    for option, local_path in (("--file", local), ("--folder", tmp_path / "folder")):
        with pytest.raises(UsageError) as refused:
            shell.run_cell_magic("kcoral", f"{option} {local_path}:../y", "1\n")
        assert str(refused.value) == (
            f"%%kcoral: {option}: path '../y' must not contain a '..' component"
        )


def test_a_return_path_given_twice_is_refused_as_given_twice(shell) -> None:
    with pytest.raises(UsageError) as refused:
        shell.run_cell_magic("kcoral", "--return-file a --return-file a", "1\n")
    assert str(refused.value) == "%%kcoral: --return-file 'a' is given twice"


def test_an_empty_local_path_is_refused_naming_its_option(shell) -> None:
    with pytest.raises(UsageError) as refused:
        shell.run_cell_magic("kcoral", "--folder :x", "1\n")
    assert str(refused.value) == "%%kcoral: --folder ':x': the local path is empty"
