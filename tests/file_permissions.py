"""Whether this process obeys file permission bits, for tests that check permission errors.

Root normally bypasses them (``CAP_DAC_OVERRIDE``, ``CAP_DAC_READ_SEARCH``), so those tests
skip there; ``tests/test_ci_required.py`` runs them again in CI with both capabilities
dropped, so they never go untested.
"""

from __future__ import annotations

import pytest

MARKER = "file_permissions"
_DAC_CAPABILITIES = (1 << 1) | (1 << 2)  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH


def bypasses_file_permissions() -> bool:
    """True when this process may read or write files regardless of their mode bits."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            for line in status:
                if line.startswith("CapEff:"):
                    return bool(int(line.split()[1], 16) & _DAC_CAPABILITIES)
    except OSError:
        pass
    import os

    return hasattr(os, "geteuid") and os.geteuid() == 0


needs_file_permissions = pytest.mark.skipif(
    bypasses_file_permissions(),
    reason="this process bypasses file permissions (root); tests/test_ci_required.py runs "
    "this test again without CAP_DAC_OVERRIDE",
)
