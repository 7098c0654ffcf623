"""Whether ``kcoral run`` was handed input it will not send (CLIENT_API §11).

The remote tool runs with its standard input closed: ``cat data.csv | kcoral run python
-- process.py`` ran the script on an empty input and said nothing, so its output looked like
the data's. Data already waiting on a pipe, or a non-empty file redirected in, is worth a
warning; a terminal, ``/dev/null`` or an empty pipe is not. A producer that has not written
yet when the run starts goes unseen: the check never reads, so it never takes what is there.
"""

from __future__ import annotations

import array
import fcntl
import os
import stat
import termios

UNSENT_INPUT_WARNING = (
    "standard input is not sent: the remote tool reads an empty one"
    " (--send FILE uploads a file the tool can open)"
)


def unsent_input_waiting(fd: int = 0) -> bool:
    """Whether ``fd`` holds bytes a reader would get now: a pipe with data waiting, or a
    regular file with bytes after its offset. Never reads, never blocks."""
    try:
        mode = os.fstat(fd).st_mode
    except OSError:
        return False  # closed: nothing was handed over
    if stat.S_ISREG(mode):
        try:
            return os.lseek(fd, 0, os.SEEK_CUR) < os.fstat(fd).st_size
        except OSError:
            return False
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        waiting = array.array("i", [0])
        try:
            fcntl.ioctl(fd, termios.FIONREAD, waiting, True)
        except OSError:
            return False
        return waiting[0] > 0
    return False  # a terminal, /dev/null or another device
