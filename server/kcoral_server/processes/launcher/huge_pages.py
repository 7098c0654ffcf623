"""The launcher's heap on huge pages, so that forking it and ending its children is cheap.

A fork copies the page tables of every private mapping that holds anonymous pages, and a
child's exit tears its copy down again. With torch preloaded the launcher has ~145 MB of
such pages (~37,000 4-KiB entries: ~3 ms to copy per fork, ~5 ms of the child's exit);
folded into 2-MiB pages (``MADV_COLLAPSE``, Linux 6.1) most of that memory is ~60
entries. A child's first write to one of them splits its own copy of that entry back into
4-KiB ones, so what children write costs as before and what they only read costs nothing.
Nothing here changes what a worker can see or do: the same memory, mapped in bigger pieces.
Where the kernel cannot (older than 6.1, ``transparent_hugepage`` set to ``never``, a
seccomp filter), nothing is folded and forks cost what they did.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
from collections.abc import Callable

#: ``MADV_COLLAPSE`` from ``<linux/mman.h>``: synchronous, whatever the system's
#: ``transparent_hugepage`` defrag setting says
MADV_COLLAPSE = 25
HUGE_PAGE = 2 << 20
#: regions with fewer anonymous pages than this are not worth a look
SMALLEST_REGION_KIB = 4096
#: how many times a region the kernel could not fold for now (``EAGAIN``: pages busy or
#: being migrated) is asked again
TRANSIENT_RETRIES = 3

Madvise = Callable[[int, int, int], int]


def collapse_heap(smaps: str = "/proc/self/smaps") -> int:
    """Fold this process's big writable private anonymous regions into huge pages; returns
    how many bytes were folded (0 where the kernel cannot)."""
    madvise = _madvise()
    if madvise is None:
        return 0
    folded = 0
    for start, end in big_anonymous_regions(smaps):
        first = (start + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1)
        last = end & ~(HUGE_PAGE - 1)
        if last <= first:
            continue
        for _attempt in range(1 + TRANSIENT_RETRIES):
            if madvise(first, last - first, MADV_COLLAPSE) == 0:
                folded += last - first
                break
            failure = ctypes.get_errno()
            if failure in (errno.EINVAL, errno.EPERM, errno.ENOSYS):
                return folded  # this kernel (or its filter) folds nothing: stop asking
            if failure != errno.EAGAIN:
                break  # ENOMEM (no free huge page now): this region stays as it is
    return folded


def _madvise() -> Madvise | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        madvise = libc.madvise
    except (OSError, AttributeError):
        return None
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise.restype = ctypes.c_int
    return madvise


def big_anonymous_regions(smaps: str = "/proc/self/smaps") -> list[tuple[int, int]]:
    """(start, end) of each writable private mapping with at least ``SMALLEST_REGION_KIB``
    of anonymous pages, from an ``smaps`` file ([] when it cannot be read)."""
    regions: list[tuple[int, int]] = []
    current: tuple[int, int] | None = None
    try:
        with open(smaps) as lines:
            for line in lines:
                head, _, rest = line.partition(" ")
                if not head.endswith(":"):  # "start-end perms offset dev inode [path]"
                    low, _, high = head.partition("-")
                    writable_private = rest[1:2] == "w" and rest[3:4] == "p"
                    current = (int(low, 16), int(high, 16)) if writable_private else None
                elif head == "Anonymous:" and current is not None:
                    if int(rest.split()[0]) >= SMALLEST_REGION_KIB:
                        regions.append(current)
                    current = None
    except (OSError, ValueError, IndexError):
        return []
    return regions
