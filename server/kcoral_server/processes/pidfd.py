"""Process descriptors where the kernel has them, and a way to act as if it had none.

``pidfd_open`` arrived in Linux 5.3. GPU hosts are often containers whose kernel reports
something older (gVisor says 4.4) or refuses the call: every user of pidfds here then falls
back — exits are seen through the fork server's exit report or by polling, signals go
through a plain ``kill`` and the fork server follows the front-end with the parent-death
signal. ``KCORAL_NO_PIDFD=1`` in the server's environment forces those fallbacks, so that
the CPU test suite covers them on any kernel.
"""

from __future__ import annotations

import os

NO_PIDFD_ENV = "KCORAL_NO_PIDFD"


def pidfds_disabled() -> bool:
    """Whether pidfds are forced off (``KCORAL_NO_PIDFD=1``) or missing from this Python."""
    return os.environ.get(NO_PIDFD_ENV) == "1" or not hasattr(os, "pidfd_open")


def open_pidfd(pid: int) -> int | None:
    """A pidfd for ``pid``, or None where pidfds are unsupported (old kernel, gVisor, forced
    off). Raises ``ProcessLookupError`` when the process is already gone."""
    if pidfds_disabled():
        return None
    try:
        return os.pidfd_open(pid)
    except ProcessLookupError:
        raise
    except OSError:  # ENOSYS (kernel < 5.3), EPERM under seccomp filters, ...
        return None
