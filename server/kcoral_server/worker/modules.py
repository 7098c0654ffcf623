"""Module uploads: Python source and CUDA source text (PROTOCOL §5.1–§5.2).

A Python module runs in a fresh ``types.ModuleType`` registered in ``sys.modules`` under a
unique synthetic name for the request (so ``dataclasses``, ``pickle`` by reference and
``inspect`` work), with its source in ``linecache`` as ``<uploaded:H>`` so tracebacks and
``inspect.getsource``-based tools can read it. Both registrations are dropped at teardown.
"""

from __future__ import annotations

import hashlib
import io
import itertools
import linecache
import os
import re
import sys
import traceback
import types
from dataclasses import dataclass
from typing import Any

from kcoral_server.worker.failures import InstructionFailure, exception_text

C_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_serial = itertools.count(1)


def uploaded_filename(source: str) -> str:
    """``<uploaded:H>``: H = first 16 hex digits of the SHA-1 of the UTF-8 source."""
    digest = hashlib.sha1(source.encode("utf-8", "surrogatepass")).hexdigest()
    return f"<uploaded:{digest[:16]}>"


@dataclass(frozen=True)
class CudaSourceModule:
    """A ``language: "cuda"`` upload: only the text is kept, nothing is compiled."""

    source: str


@dataclass(frozen=True)
class CudaSourceFunction:
    """What ``get_function`` binds for a CUDA-source module."""

    source: str
    name: str


def cuda_function(module: CudaSourceModule, name: str) -> CudaSourceFunction:
    if not C_IDENTIFIER.fullmatch(name) or name == "main":
        raise InstructionFailure(
            "parse", f"{name!r} is not a valid CUDA function name (a C identifier, not 'main')"
        )
    return CudaSourceFunction(module.source, name)


class PythonModules:
    """The Python modules of one program, and their clean-up."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.filenames: list[str] = []

    def compile(self, source: str) -> tuple[types.ModuleType, types.CodeType]:
        """A fresh registered module and its code; compile errors fail with ``parse``."""
        filename = uploaded_filename(source)
        # a byte order mark, as editors on Windows save one, is no code: Python skips it at
        # the start of a file, but compile() of a str called it 'invalid non-printable
        # character U+FEFF' on line 1 (the name above is still that of the source sent)
        source = source.removeprefix("\ufeff")
        if filename not in linecache.cache:
            # lines as compile() counts them (\n, \r\n, \r): str.splitlines also breaks at
            # \f, \v, \x1c-\x1e, \x85, \u2028 and \u2029, so a form feed in a comment put
            # every later line one off: tracebacks showed the wrong line and
            # inspect.getsource (Triton, TIRx) handed back the function before
            lines = io.StringIO(source, newline="").readlines()
            if lines and not lines[-1].endswith("\n"):
                lines[-1] += "\n"
            # mtime None: linecache.checkcache never evicts it (no file to compare with)
            linecache.cache[filename] = (len(source), None, lines, filename)
            self.filenames.append(filename)
        try:
            code = compile(source, filename, "exec", dont_inherit=True)
        except (SyntaxError, ValueError, OverflowError, RecursionError, MemoryError) as exc:
            text = "".join(traceback.format_exception_only(type(exc), exc))
            raise InstructionFailure("parse", exception_text(exc), text) from None
        name = f"kcoral_uploaded_{os.getpid()}_{next(_serial)}"
        module = types.ModuleType(name)
        module.__dict__["__builtins__"] = __builtins__
        sys.modules[name] = module
        self.names.append(name)
        return module, code

    def teardown(self) -> None:
        for name in self.names:
            sys.modules.pop(name, None)
        for filename in self.filenames:
            linecache.cache.pop(filename, None)
        self.names.clear()
        self.filenames.clear()


def python_attribute(module: types.ModuleType, name: str, module_id: str) -> Any:
    """``get_function`` on a Python module: any attribute, missing name fails ``parse``."""
    try:
        return getattr(module, name)
    except AttributeError:
        raise InstructionFailure(
            "parse", f"module '{module_id}' has no attribute {name!r}"
        ) from None
