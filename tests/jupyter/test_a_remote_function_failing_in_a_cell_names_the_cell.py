"""A remote function defined in a notebook cell that fails on the server: its remote
traceback names the cell as IPython's own tracebacks do (``Cell In[N], line L``), not the
file the kernel keeps the cell in (``/tmp/ipykernel_81/2841.py``), which the user never sees
(CLIENT_API §9). The in-process IPython shell against a real CPU server."""

from __future__ import annotations

import sys

import pytest
from IPython.utils.capture import capture_output

pytestmark = pytest.mark.skipif(
    sys.version_info < (3, 11), reason="exception notes (PEP 678) need Python 3.11"
)

CELL = """
import kcoral

@kcoral.Client({url!r}).function(serialization={fmt!r})
def fails_in_a_cell(x):
    y = x + 1
    raise ValueError(f"bad {{y}}")

fails_in_a_cell.remote(1)
"""


@pytest.mark.parametrize("fmt", ["json", "pickle"])
def test_the_remote_traceback_names_the_cell_and_its_line(
    shell, cpu_server_url: str, fmt: str
) -> None:
    with capture_output():
        result = shell.run_cell(CELL.format(url=cpu_server_url, fmt=fmt).lstrip())
    error = result.error_in_exec
    assert error is not None
    count = result.execution_count
    note = error.__notes__[0]
    assert f"  Cell In[{count}], line 6, in fails_in_a_cell\n" in note, note
    assert 'raise ValueError(f"bad {y}")' in note
    assert "ipython-input" not in note and "ipykernel" not in note
