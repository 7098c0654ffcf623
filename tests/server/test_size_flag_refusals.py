"""A size flag's refusal says what a size is (SERVER §2: plain bytes, or K, M, G or T for
KiB to TiB; ``GB`` is refused as ambiguous), on ``kcoral server`` and ``kcoral router``.

Before, ``--max-request-bytes 1GB`` (or ``1.5G``) read only ``invalid size: '1GB'``: the
units note is at the top of a 190-line ``--help``, and an operator who wrote the size the
way a disk is sold had nothing to go on.
"""

from __future__ import annotations

import subprocess
import sys

import pytest

UNITS = "a whole number of bytes, or one ending in K, M, G or T, binary: 256M, 4G, 4GiB"


@pytest.mark.parametrize("command", ["server", "router"])
@pytest.mark.parametrize("size", ["1GB", "1.5G"])
def test_a_size_flag_no_unit_fits_is_refused_saying_what_a_size_is(command: str, size: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "kcoral", command, "--port", "0", "--max-request-bytes", size],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    last = done.stderr.strip().splitlines()[-1]
    assert last == (
        f"kcoral {command}: error: argument --max-request-bytes: invalid size: {size!r} ({UNITS})"
    )
