"""``%%kcoral --file`` naming a file the kernel cannot read, in the shell of the Jupyter tests
(real CPU server): the refusal names the option and the path. Before, a missing file read
``%%kcoral: [Errno 2] No such file or directory: '…'``, which said neither which option
nor in the usual words."""

from __future__ import annotations

from pathlib import Path

import pytest
from IPython.core.error import UsageError


def test_a_missing_file_is_refused_naming_the_option(shell, tmp_path: Path) -> None:
    missing = tmp_path / "not-there.txt"
    with pytest.raises(UsageError) as refused:
        shell.run_cell_magic("kcoral", f"--file {missing}", "1\n")
    assert str(refused.value) == f"%%kcoral: --file '{missing}': No such file or directory"


def test_a_path_through_a_file_is_refused_naming_the_option(shell, tmp_path: Path) -> None:
    under_a_file = tmp_path / "plain.txt" / "inner.txt"
    under_a_file.parent.write_text("x")
    with pytest.raises(UsageError) as refused:
        shell.run_cell_magic("kcoral", f"--file {under_a_file}", "1\n")
    assert str(refused.value) == f"%%kcoral: --file '{under_a_file}': Not a directory"
