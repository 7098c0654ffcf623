"""How many descriptors a process may hold: raise the soft ``RLIMIT_NOFILE`` to the hard one.

A front end holds one descriptor per client connection, worker pipe and memfd. Distributions
start processes at a soft limit of 1024 while the hard limit is usually far higher; at 1024 a
few hundred idle sockets made ``accept`` fail with ``Too many open files`` (issue 28). The
soft limit is the process's own choice, so each KCoral process takes all it is allowed; the
systemd units raise the hard limit too (``LimitNOFILE``).
"""

from __future__ import annotations

import resource


def raise_open_file_limit() -> int:
    """Set the soft ``RLIMIT_NOFILE`` to the hard limit; returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError):
            pass  # a sandbox that forbids it leaves the limit the process started with
    elif hard == resource.RLIM_INFINITY and soft != hard:
        # An unlimited hard limit cannot be the soft one on Linux (nr_open caps it); take
        # the kernel's per-process ceiling instead.
        try:
            with open("/proc/sys/fs/nr_open", encoding="ascii") as nr_open:
                ceiling = int(nr_open.read())
            resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, ceiling), hard))
            soft = max(soft, ceiling)
        except (ValueError, OSError):
            pass
    return soft
