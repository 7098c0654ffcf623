"""Library uploads through ``tvm_ffi`` (PROTOCOL §5.1–§5.2, SERVER §10, EXTENSIONS §2).

A library blob is written to a private temporary file, loaded with
``tvm_ffi.load_module`` and the file and its directory removed again (the dynamic loader
keeps its own mapping). Loaded modules are memoized per worker by SHA-256, at most
``CAPACITY`` of them, least recently used first out. A bound export holds its module, so a
library stays loaded while any function taken from it lives, even after the cache let go
of it.

``tvm_ffi`` is imported on first use only: CPU workers that never see a library never pay
for it.
"""

from __future__ import annotations

import contextlib
import importlib
import inspect
import itertools
import os
import sys
import tempfile
from collections import OrderedDict
from typing import Any

from kcoral_server.worker.failures import InstructionFailure, exception_text

CAPACITY = 32

# Every load gets a file name of its own: glibc's dlopen answers a second open of an
# already loaded *path* with the old handle, so reusing names could hand back stale code.
_serial = itertools.count(1)


class LibraryFunction:
    """A bound library export; it keeps its library loaded for as long as it lives."""

    def __init__(self, library: Any, function: Any, name: str) -> None:
        self.library = library
        self.function = function
        self.name = name

    def __call__(self, *args: Any) -> Any:
        return self.function(*args)

    def __repr__(self) -> str:
        return f"<library function {self.name}>"


class Libraries:
    """Per-worker loader and cache of TVM-FFI libraries, keyed by the blob's SHA-256."""

    def __init__(self, unavailable_message: str, capacity: int = CAPACITY) -> None:
        self.unavailable_message = unavailable_message
        self.capacity = capacity
        self._loaded: OrderedDict[str, Any] = OrderedDict()
        self._directory: str | None = None

    def __contains__(self, sha256: object) -> bool:
        return sha256 in self._loaded

    def __len__(self) -> int:
        return len(self._loaded)

    def load(self, sha256: str, data: bytes | memoryview) -> Any:
        """The loaded module for this blob; ``compile`` if it cannot be loaded."""
        cached = self._loaded.get(sha256)
        if cached is not None:
            self._loaded.move_to_end(sha256)
            return cached
        tvm_ffi = self._tvm_ffi()
        problem = elf_problem(data, _own_elf_header())
        if problem is not None:
            raise InstructionFailure("compile", f"cannot load library: {problem}")
        path = self._write(sha256, data)
        try:
            library = _load_module(tvm_ffi, path)
        except Exception as exc:
            raise InstructionFailure(
                "compile", f"cannot load library: {exception_text(exc)}"
            ) from None
        finally:
            with contextlib.suppress(OSError):
                os.unlink(path)
            self._remove_directory()
        self._loaded[sha256] = library
        while len(self._loaded) > self.capacity:
            self._loaded.popitem(last=False)
        return library

    def clear(self) -> None:
        """Forget every cached library (bound functions still keep theirs alive)."""
        self._loaded.clear()

    def _tvm_ffi(self) -> Any:
        try:
            return importlib.import_module("tvm_ffi")
        except ImportError:
            raise InstructionFailure("unavailable", self.unavailable_message) from None

    def _remove_directory(self) -> None:
        """Remove the (now empty) directory of the last load: an unsandboxed worker's is in
        the host's ``/tmp``, which nothing else empties (one was left per worker)."""
        directory, self._directory = self._directory, None
        if directory is not None:
            with contextlib.suppress(OSError):
                os.rmdir(directory)

    def _write(self, sha256: str, data: bytes | memoryview) -> str:
        path = None
        try:
            # honours TMPDIR, which the sandbox points into the worker's own state
            self._directory = tempfile.mkdtemp(prefix="kcoral-libraries-")
            path = os.path.join(self._directory, f"{sha256[:16]}-{next(_serial)}.so")
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o700)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
        except OSError as exc:
            if path is not None:  # e.g. the disk filled up while writing it
                with contextlib.suppress(OSError):
                    os.unlink(path)
            self._remove_directory()
            raise InstructionFailure(
                "compile", f"cannot write the library to a temporary file: {exception_text(exc)}"
            ) from None
        return path


def _load_module(tvm_ffi: Any, path: str) -> Any:
    load = tvm_ffi.load_module
    # tvm_ffi keeps modules in a process-wide list by default, which would defeat the
    # 32-entry bound; our cache and the bound functions hold them instead.
    try:
        accepts_flag = "keep_module_alive" in inspect.signature(load).parameters
    except (TypeError, ValueError):
        accepts_flag = False
    if accepts_flag:
        return load(path, keep_module_alive=False)
    return load(path)


def _no_export(name: str) -> InstructionFailure:
    """A missing export, and where a plain C function goes instead: a C library built with
    gcc and uploaded as a library loaded, then said only 'library has no export'."""
    return InstructionFailure(
        "compile",
        f"library has no export {name!r}: a library upload exports TVM-FFI functions "
        "(TVM_FFI_DLL_EXPORT_TYPED_FUNC, tvm_ffi.cpp.build); call a plain C function with "
        "ctypes.CDLL from a module instead, the .so sent with upload_file",
    )


def library_function(library: Any, name: str) -> LibraryFunction:
    """``get_function`` on a library handle (PROTOCOL §5.2 library row).

    A missing export or one that cannot be bound fails with ``compile``; a handle that
    cannot be asked for its exports at all fails with ``runtime``.
    """
    getter = getattr(library, "get_function", None)
    if not callable(getter):
        raise InstructionFailure("runtime", "the loaded library cannot be queried for exports")
    implements = getattr(library, "implements_function", None)
    if callable(implements):
        try:
            exported = bool(implements(name, True))
        except Exception as exc:
            raise InstructionFailure(
                "runtime",
                f"the loaded library cannot be queried for exports: {exception_text(exc)}",
            ) from None
        if not exported:
            raise _no_export(name)
    try:
        function = getter(name, True)
    except AttributeError:
        raise _no_export(name) from None
    except Exception as exc:
        raise InstructionFailure(
            "compile", f"cannot bind library export {name!r}: {exception_text(exc)}"
        ) from None
    if function is None:
        raise _no_export(name)
    if not callable(function):
        raise InstructionFailure("compile", f"library export {name!r} is not a function")
    return LibraryFunction(library, function, name)


# ELF header fields (the ELF specification): class and byte order in e_ident, then e_type
# and e_machine, both in the file's byte order.
_ELF_MAGIC = b"\x7fELF"
_ELF_HEADER_BYTES = 20
_SHARED_OBJECT = 3  # ET_DYN
_OTHER_TYPES = {1: "relocatable object (.o)", 2: "executable", 4: "core dump"}
_MACHINES = {
    3: "x86 (i386)",
    8: "MIPS",
    20: "PowerPC",
    21: "PowerPC64",
    22: "s390x",
    40: "ARM (32-bit)",
    62: "x86-64",
    183: "AArch64 (arm64)",
    243: "RISC-V",
    258: "LoongArch",
}


def elf_problem(data: bytes | memoryview, own: bytes | None) -> str | None:
    """Why ``data`` is no shared object this worker's machine can load, in words that say
    what to build, or None. The dynamic loader's own words misled: a library built for
    another machine read 'cannot open shared object file: No such file or directory' (the
    loader skips such a file as if it were absent), and bytes that are no ELF file 'file
    too short' or 'invalid ELF header', each after the worker's temporary path twice.
    ``own`` is the header of the worker's interpreter (None: not checked against it)."""
    header = bytes(data[:_ELF_HEADER_BYTES])
    if len(header) < _ELF_HEADER_BYTES or not header.startswith(_ELF_MAGIC):
        return (
            f"it is not a shared library (an ELF file; its bytes begin {header[:8]!r}): "
            "upload the .so file the compiler or linker wrote"
        )
    kind = _half(header, 16)  # e_type
    if own is not None and own[4:6] + own[18:20] != header[4:6] + header[18:20]:
        return (
            f"it is built for {_machine(header)}; this server's workers run "
            f"{_machine(own)}: build it for {_machine(own)}"
        )
    if kind != _SHARED_OBJECT:
        what = _OTHER_TYPES.get(kind, f"file of ELF type {kind}")
        return f"it is an ELF {what}, not a shared library: link it with -shared"
    return None


def _machine(header: bytes) -> str:
    """The machine an ELF header names, with its word size and byte order where odd."""
    number = _half(header, 18)  # e_machine
    name = _MACHINES.get(number, f"ELF machine {number}")
    bits = {1: "32-bit", 2: "64-bit"}.get(header[4], "unknown word size")
    return f"{name}, {bits}{', big-endian' if header[5] == 2 else ''}"


def _half(header: bytes, start: int) -> int:
    """The two-byte header field at ``start``, in the file's byte order (e_ident[5])."""
    return int.from_bytes(header[start : start + 2], "big" if header[5] == 2 else "little")


def _own_elf_header() -> bytes | None:
    """The ELF header of the interpreter this worker runs (its machine, word size and byte
    order are the ones a library must have), or None where it cannot be read."""
    try:
        with open(sys.executable, "rb") as interpreter:
            header = interpreter.read(_ELF_HEADER_BYTES)
    except OSError:
        return None
    return header if header.startswith(_ELF_MAGIC) and len(header) == _ELF_HEADER_BYTES else None
