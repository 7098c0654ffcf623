"""A ``%%kcoral`` timeout or output limit no server can take is refused in one line, before
anything is sent (shell of the Jupyter tests, real CPU server). ``--timeout nan`` (or
``%config KCoral.timeout = float('inf')``) failed inside the client, ``ValueError: cannot
encode the request``, with a traceback through the extension's frames; a negative
``--output-limit`` went to the server, whose 400 came with "the server could not read the
request"."""

from __future__ import annotations

import pytest
from IPython.core.error import UsageError


@pytest.mark.parametrize("value", ["nan", "inf", "-5", "0"])
def test_a_timeout_that_is_not_a_positive_number_is_refused(shell, value: str) -> None:
    with pytest.raises(UsageError) as refused:
        shell.run_cell_magic("kcoral", f"--timeout {value}", "1\n")
    assert str(refused.value) == (
        f"%%kcoral: --timeout must be a number of seconds above 0, not {float(value):g}"
    )


def test_a_timeout_setting_that_is_not_finite_is_refused_naming_the_setting(shell) -> None:
    shell.run_line_magic("config", "KCoral.timeout = float('inf')")
    with pytest.raises(UsageError) as refused:
        shell.run_cell_magic("kcoral", "", "1\n")
    assert str(refused.value) == (
        "%%kcoral: KCoral.timeout must be a number of seconds above 0, not inf"
    )


def test_a_negative_output_limit_is_refused(shell) -> None:
    with pytest.raises(UsageError) as refused:
        shell.run_cell_magic("kcoral", "--output-limit -1", "1\n")
    assert str(refused.value) == "%%kcoral: --output-limit must be 0 or more bytes, not -1"
