"""The progress slot: which instruction a worker started last, and how its program's stdout
and stderr interleaved so far, in memory it shares with the front-end.

The worker writes the index before it runs each instruction; the front-end reads it once a
program ended, to name the instruction a crash belongs to, without a frame per instruction
(only a program followed live sends ``ipc.InstructionStarted``). The worker also writes each
switch between its two streams as a run (``processes.output_order``) as it happens, which a
live follower reads at each poll to send a job's output in the order it was written
(EXTENSIONS §16): no frame, and nothing at all for a program that writes one stream.
"""

from __future__ import annotations

import ctypes
import fcntl
import mmap
import os
import struct
import weakref

from kcoral.protocol.output_order import MAX_RUNS, STREAM_NAMES, Run

#: the slot starts with two little-endian int64: 0 before any instruction, else 1 + the
#: index started; and the number of runs written since the program began. The runs follow,
#: ``[stream, end]`` each (at most ``MAX_RUNS``, a fixed size: reading one costs no more)
_INT = struct.Struct("<q")
_RUN_COUNT_AT = _INT.size
_RUN = struct.Struct("<qq")
_RUNS_AT = 2 * _INT.size
_SLOT_SIZE = _RUNS_AT + MAX_RUNS * _RUN.size
_SLOT_SEALS = fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL
_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC.mmap.restype = ctypes.c_void_p
_LIBC.mmap.argtypes = (
    ctypes.c_void_p,
    ctypes.c_size_t,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_int,
    ctypes.c_long,
)
_LIBC.munmap.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
_MAP_FAILED = ctypes.c_void_p(-1).value


class ProgressSlot:
    """Which instruction of the current program a worker started last, in shared memory.

    Who can reach it: the front-end, which creates the memfd, and the one worker process it
    is sent to, i.e. also that worker's programs (uploaded code), which can write any value
    (as they can already send any ``InstructionStarted`` frame on the socket). The front-end
    therefore only trusts an index inside the program it sent (``last_started``), reads runs
    only as hints for the order of bytes it reads from its own capture files
    (``runs_since``: at most ``MAX_RUNS``, well-formed ones, never more than asked), and the
    memfd is sealed against shrinking before it is sent: a mapping of a truncated memfd
    would kill the front-end with ``SIGBUS`` on its next read.

    The pages are mapped through libc, not ``mmap.mmap``, which keeps a duplicate of the
    descriptor open for as long as the mapping lives: a slot holds no descriptor in either
    process. It is unmapped by ``close`` or when the slot is collected.
    """

    def __init__(self, fd: int) -> None:
        """Map the slot memfd ``fd`` (the caller still closes ``fd``)."""
        address = _LIBC.mmap(
            None, _SLOT_SIZE, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0
        )
        if address is None or address == _MAP_FAILED:
            error = ctypes.get_errno()
            raise OSError(error, os.strerror(error))
        self._view: ctypes.Array | None = (ctypes.c_char * _SLOT_SIZE).from_address(address)
        self._unmap = weakref.finalize(self, _LIBC.munmap, address, _SLOT_SIZE)
        # an exiting process's mappings go with it: not at exit, where a one-shot worker's
        # exit report would wait for the walk over every finalizer (``launcher.finalizers``)
        self._unmap.atexit = False

    @classmethod
    def create(cls) -> tuple[ProgressSlot, int]:
        """The front-end's slot and its sealed memfd (the caller sends, then closes it).
        ``OSError`` where memfds or seals are unavailable."""
        fd = os.memfd_create("kcoral-progress", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, _SLOT_SIZE)
            fcntl.fcntl(fd, fcntl.F_ADD_SEALS, _SLOT_SEALS)
            return cls(fd), fd
        except BaseException:
            os.close(fd)
            raise

    @classmethod
    def attach(cls, fd: int) -> ProgressSlot:
        """The worker's view of a received slot memfd (the caller closes ``fd``)."""
        return cls(fd)

    def reset(self) -> None:
        """No instruction started yet, no run written (the front-end, before it sends a
        program)."""
        if self._view is not None:
            _INT.pack_into(self._view, 0, 0)
            _INT.pack_into(self._view, _RUN_COUNT_AT, 0)

    def started(self, index: int) -> None:
        """The worker is about to run instruction ``index``."""
        if self._view is not None:
            _INT.pack_into(self._view, 0, index + 1)

    def any_started(self) -> bool:
        """Whether an instruction started since ``reset`` (uploaded code can write, once run)."""
        return self._view is not None and _INT.unpack_from(self._view, 0)[0] != 0

    def run_written(self, index: int, stream: int, end: int) -> None:
        """The worker's run number ``index`` of the program (``StreamOrder``): the run first,
        then the count, so a reader never counts a run not yet written (x86 keeps stores
        in order; elsewhere a torn read only misorders a hint)."""
        if self._view is not None and 0 <= index < MAX_RUNS:
            _RUN.pack_into(self._view, _RUNS_AT + index * _RUN.size, stream, end)
            _INT.pack_into(self._view, _RUN_COUNT_AT, index + 1)

    def runs_since(self, first: int, most: int) -> list[Run]:
        """Runs ``first`` onwards, at most ``most`` of them, up to the first that is not
        ``[1 or 2, end]`` (uploaded code can write any bytes here; a count past
        ``MAX_RUNS`` counts as ``MAX_RUNS``)."""
        if self._view is None:
            return []
        (count,) = _INT.unpack_from(self._view, _RUN_COUNT_AT)
        runs: list[Run] = []
        for index in range(max(first, 0), min(count, MAX_RUNS, first + most)):
            stream, end = _RUN.unpack_from(self._view, _RUNS_AT + index * _RUN.size)
            if stream not in STREAM_NAMES:
                break
            runs.append((stream, end))
        return runs

    def last_started(self, instruction_count: int) -> int | None:
        """Index of the last instruction started, or None: none started, or a value no
        instruction of a program of ``instruction_count`` has (written by uploaded code)."""
        if self._view is None:
            return None
        (value,) = _INT.unpack_from(self._view, 0)
        return value - 1 if 1 <= value <= instruction_count else None

    def close(self) -> None:
        self._view = None  # before the unmap: nothing reads the page afterwards
        self._unmap()
