"""Turn a ``%%kcoral`` cell into a ``kcoral.Program`` and its result back into values.

Inputs travel in the cheapest honest form: tensors (NumPy, torch, DLPack) as tensor uploads,
``bytes`` as bytes uploads, JSON values as one literal argument, and everything else pickled
in one ``bytes`` upload (which needs ``X-KCoral-Serialization: pickle``). No IPython here.

Types (the rule the magic's help and the README state): a tensor ``-i`` value arrives on the
server as the server makes tensor uploads (``torch.Tensor`` where the worker has torch, on
the GPU of a GPU server; else NumPy). What comes back (``-o`` tensors and the final value) is
in the library of the cell's ``-i`` tensors: NumPy in, NumPy out; torch in, torch out. With
no tensor ``-i`` or both kinds, a remote ``torch.Tensor`` comes back as torch when the kernel
has torch and a remote NumPy array as NumPy, at the top of a value or inside its dicts and
lists alike; ``--numpy``/``--torch`` force either (all the way in).

Who can reach what (a malicious server): the answer is checked against what this cell asked
for before anything reaches the kernel's namespace. Only the ``--out`` names come back, only
they are unpickled, and only when the cell itself was sent with pickle (``load_requested``
gets exactly that set); HTML the server authored is shown only in a sandboxed iframe.
"""

from __future__ import annotations

import math
import os
import stat
import sys
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kcoral import Program, ProgramResult
from kcoral.errors import ProtocolError
from kcoral.local_folder import kind_of
from kcoral.protocol.dtypes import dtype_name_of_numpy
from kcoral_jupyter.cell_source import CELL_FUNCTION, wrapper_source
from kcoral_jupyter.unsent_value import add_unsent_note

#: Return key of the cell's own value (outputs, final expression).
CELL_KEY = "cell"
FILE_KEY_PREFIX = "file:"
FOLDER_KEY_PREFIX = "folder:"


@dataclass(frozen=True)
class CellSpec:
    """Everything the magic's options say about one cell, before anything is uploaded."""

    source: str
    inputs: Mapping[str, Any] = field(default_factory=dict)
    outputs: Sequence[str] = ()
    files: Sequence[tuple[str, str]] = ()  # (local path, remote path)
    folders: Sequence[tuple[str, str]] = ()
    return_files: Sequence[str] = ()
    return_folders: Sequence[str] = ()
    numpy: bool = False  # --numpy
    torch: bool = False  # --torch
    in_session: bool = False  # run in the session's kcoral.session.namespace (EXTENSIONS §11)


@dataclass(frozen=True)
class BuiltCell:
    """The program for a cell plus what is needed to read its result."""

    program: Program
    serialization: str | None  # "pickle" when some input had to be pickled
    pickled_inputs: tuple[str, ...]
    # What the cell asked to get back: nothing else is accepted from the server.
    outputs: tuple[str, ...] = ()
    return_files: tuple[str, ...] = ()
    return_folders: tuple[str, ...] = ()
    numpy: bool = False  # --numpy: remote torch tensors come back as NumPy arrays
    # "numpy"/"torch": every tensor comes back in that library (--numpy/--torch, or the
    # library of all the cell's tensor inputs); None: each as its remote type.
    library: str | None = None
    source: str = ""  # the cell's own text (a NameError's hint asks what it binds)
    in_session: bool = False  # ran in a session (a value that did not come back can stay)

    @property
    def pickle_outputs(self) -> frozenset[str]:
        """The ``--out`` names the server may answer pickled: all of them when the request
        is sent with pickle (the wrapper pickles only what has no plain encoding), else none."""
        return frozenset(self.outputs) if self.serialization == "pickle" else frozenset()

    @property
    def return_keys(self) -> frozenset[str]:
        """The program's return keys: the cell record plus each file and folder asked for."""
        return frozenset(
            [CELL_KEY]
            + [FILE_KEY_PREFIX + path for path in self.return_files]
            + [FOLDER_KEY_PREFIX + path for path in self.return_folders]
        )


@dataclass(frozen=True)
class CellOutcome:
    """The decoded result of a cell."""

    outputs: dict[str, Any]
    has_value: bool
    value: Any = None
    # A final value the server could only describe, made safe: text, or HTML in a sandbox.
    display: dict[str, str] | None = None
    files: dict[str, Any] = field(default_factory=dict)  # return path -> ReturnedFile/Folder


def split_mapping(text: str, option: str = "--file") -> tuple[str, str]:
    """``LOCAL[:REMOTE]`` -> (local, remote); the remote defaults to the local base name.

    A local path may hold colons (``run_12:30.csv``): the text is taken whole when it names
    something here, else it is cut at the first colon whose left side does, else at the
    first colon. Before, it was always cut at the first: such a file could not be sent."""
    local, remote = text, ""
    cuts = [index for index, char in enumerate(text) if char == ":"]
    if cuts and not os.path.lexists(text):
        cut = next((index for index in cuts if os.path.lexists(text[:index])), cuts[0])
        local, remote = text[:cut], text[cut + 1 :]
    if not local:
        raise ValueError(f"{option} {text!r}: the local path is empty")
    if not remote:
        remote = Path(local.rstrip("/")).name or local
    return local, remote


def is_json_value(value: Any, depth: int = 0) -> bool:
    """Exactly the JSON types (no subclasses, no tuples), finite floats, str-keyed dicts."""
    if depth > 100:
        return False
    kind = type(value)
    if value is None or kind in (bool, int, str):
        return True
    if kind is float:
        return math.isfinite(value)
    if kind is list:
        return all(is_json_value(item, depth + 1) for item in value)
    if kind is dict:
        return all(type(k) is str and is_json_value(v, depth + 1) for k, v in value.items())
    return False


def is_torch_tensor(value: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def _is_tensor_like(value: Any) -> bool:
    if is_torch_tensor(value):
        return str(value.dtype).removeprefix("torch.") in _PROTOCOL_DTYPES
    numpy = sys.modules.get("numpy")
    if numpy is not None and isinstance(value, numpy.ndarray):
        return dtype_name_of_numpy(value.dtype) is not None
    return False


_PROTOCOL_DTYPES = frozenset(
    (
        "bool",
        "uint8",
        "int8",
        "int16",
        "int32",
        "int64",
        "float16",
        "float32",
        "float64",
        "bfloat16",
        "float8_e4m3fn",
        "float8_e5m2",
    )
)


#: Flags a laptop's OS has: Windows lacks O_NONBLOCK and O_CLOEXEC, and needs O_BINARY.
_READ_FLAGS = (
    os.O_RDONLY
    | getattr(os, "O_NONBLOCK", 0)
    | getattr(os, "O_CLOEXEC", 0)
    | getattr(os, "O_BINARY", 0)
)


def read_local_file(path: str) -> bytes:
    """The bytes of the regular file at ``path`` (symlinks followed) for ``--file``.

    ``ValueError`` for anything else: reading a FIFO blocked the kernel until a writer came,
    and a device may never end. Opened with ``O_NONBLOCK`` (no effect on a regular file) and
    checked again once open, so a FIFO put in its place cannot block either. The file's
    size is not trusted: ``/proc`` files say 0 and have content."""
    shown = f"--file {path!r}"
    try:  # named by its option: "[Errno 2] No such file or directory: 'x'" said neither
        mode = os.stat(path).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"{shown} is a {kind_of(mode)}, not a regular file")
        fd = os.open(path, _READ_FLAGS)
    except OSError as exc:
        raise ValueError(f"{shown}: {exc.strerror or exc}") from None
    with open(fd, "rb") as handle:
        if not stat.S_ISREG(mode := os.fstat(fd).st_mode):
            raise ValueError(f"{shown} is a {kind_of(mode)}, not a regular file")
        return handle.read()


@contextmanager
def named_by(option: str) -> Iterator[None]:
    """A path rule one of the cell's options breaks, named by that option: "path '../up'
    must not contain a '..' component" alone did not say which option's path it was."""
    try:
        yield
    except ValueError as exc:
        raise ValueError(f"{option}: {exc}") from None


def build_cell(spec: CellSpec) -> BuiltCell:
    """The program: file/folder uploads, the wrapper module, one run, the returns."""
    program = Program()
    for local, remote in spec.files:
        blob = read_local_file(local)
        with named_by("--file"):
            program.upload_file(blob=blob, path=remote)
    for local, remote in spec.folders:
        if not os.path.isdir(local):
            raise NotADirectoryError(f"--folder {local!r} is not a directory")
        with named_by("--folder"):
            program.upload_folder(local, path=remote)

    literals: dict[str, Any] = {}
    binary_names: list[str] = []
    binary_values: list[Any] = []
    pickled: dict[str, Any] = {}
    for name, value in spec.inputs.items():
        if _is_tensor_like(value):
            binary_names.append(name)
            binary_values.append(program.upload(kind="tensor", value=value, id=f"in:{name}"))
        elif isinstance(value, (bytes, bytearray, memoryview)):
            binary_names.append(name)
            binary_values.append(program.upload(kind="bytes", value=value, id=f"in:{name}"))
        elif is_json_value(value):
            literals[name] = value
        else:
            pickled[name] = value
    if pickled:
        from kcoral.remote import dump_by_value

        try:
            payload = dump_by_value(pickled)
        except Exception as exc:
            names = ", ".join(pickled)
            raise TypeError(f"--in {names}: cannot pickle: {type(exc).__name__}: {exc}") from exc
        binary_values.append(program.upload(kind="bytes", value=payload, id="in:pickled"))

    module = program.upload(
        kind="module",
        source=wrapper_source(spec.source, list(spec.outputs), in_session=spec.in_session),
        id="cell_module",
    )
    function = program.get_function(module=module, name=CELL_FUNCTION, id="cell_function")
    # The literal dict sits inside a list position, so reference-shaped data stays literal.
    run = program.run(fn=function, args=[literals, binary_names, *binary_values], id="cell")
    program.return_(key=CELL_KEY, value=run)
    for option, paths in (
        ("--return-file", spec.return_files),
        ("--return-folder", spec.return_folders),
    ):
        twice = sorted({path for path in paths if list(paths).count(path) > 1})
        if twice:  # else "return key 'file:a' is already used", the magic's own key
            raise ValueError(f"{option} {twice[0]!r} is given twice")
    for path in spec.return_files:
        with named_by("--return-file"):
            program.return_file(key=FILE_KEY_PREFIX + path, path=path)
    for path in spec.return_folders:
        with named_by("--return-folder"):
            program.return_folder(key=FOLDER_KEY_PREFIX + path, path=path)
    return BuiltCell(
        program=program,
        serialization="pickle" if pickled else None,
        pickled_inputs=tuple(pickled),
        outputs=tuple(spec.outputs),
        return_files=tuple(spec.return_files),
        return_folders=tuple(spec.return_folders),
        numpy=spec.numpy,
        library=returned_library(spec),
        source=spec.source,
        in_session=spec.in_session,
    )


def returned_library(spec: CellSpec) -> str | None:
    """The library every tensor of the cell comes back in ("numpy", "torch"), or None for
    "each as its remote type": ``--numpy``/``--torch``, else the one library of the cell's
    tensor inputs (NumPy in, NumPy out; torch in, torch out); none or both give None."""
    if spec.numpy and spec.torch:
        raise ValueError("--numpy and --torch contradict each other: give one")
    if spec.numpy:
        return "numpy"
    if spec.torch:
        if not kernel_has_torch():
            raise ValueError("--torch: this kernel cannot import torch")
        return "torch"
    numpy = sys.modules.get("numpy")
    kinds = {
        "torch" if is_torch_tensor(value) else "numpy"
        for value in spec.inputs.values()
        if is_torch_tensor(value) or (numpy is not None and isinstance(value, numpy.ndarray))
    }
    return kinds.pop() if len(kinds) == 1 else None


#: The fields of the record the wrapper returns (``cell_source._collect``).
_CELL_FIELDS = frozenset(
    (
        "outputs",
        "pickled",
        "has_value",
        "value",
        "display",
        "torch",
        "torch_value",
        "torch_inside",
        "unsent",
    )
)


def read_outcome(result: ProgramResult, built: BuiltCell) -> CellOutcome:
    """Decode the ``COMPLETED`` result of ``built``; ``ProtocolError`` for anything it did
    not ask for.

    The whole answer is checked before any value is unpickled or bound: an unexpected return
    key, record field or ``--out`` name, a name sent twice or not at all, or a pickled value
    the cell did not send with pickle. Refusing the whole answer (rather than ignoring the
    extra) keeps the namespace untouched and tells the user the server misbehaved. Tensors
    that were ``torch.Tensor`` on the server come back as torch when the kernel has torch
    (not with ``--numpy``).
    """
    what = f"request {result.request_id}"
    unexpected = sorted(set(result.results) - built.return_keys)
    if unexpected:
        raise ProtocolError(
            f"{what}: the server returned keys the cell did not ask for: {unexpected}"
        )
    cell = result.results.get(CELL_KEY)
    if not isinstance(cell, dict):
        raise ProtocolError(f"{what}: the cell returned no value record")
    extra_fields = sorted(set(cell) - _CELL_FIELDS)
    if extra_fields:
        raise ProtocolError(f"{what}: the cell record has unknown fields {extra_fields}")
    outputs = cell.get("outputs", {})
    pickled = cell.get("pickled", {})
    if not isinstance(outputs, dict):
        raise ProtocolError(f"{what}: the cell's outputs must be an object")
    if not isinstance(pickled, dict):
        raise ProtocolError(
            f"{what}: the cell's pickled values must be an object of names (one envelope each), "
            f"not a {type(pickled).__name__}; nothing was unpickled"
        )
    requested = set(built.outputs)
    problems = [
        f"{label} {names}"
        for label, names in (
            ("names the cell did not ask for with -o:", sorted(set(outputs) - requested)),
            ("names sent twice:", sorted(set(outputs) & set(pickled))),
            ("no value for -o", sorted(requested - set(outputs) - set(pickled))),
        )
        if names
    ]
    if problems:
        raise ProtocolError(f"{what}: the server's answer has {'; '.join(problems)}; nothing bound")
    torch_names = cell.get("torch", [])
    if (
        not isinstance(torch_names, list)
        or not all(isinstance(name, str) for name in torch_names)
        or not set(torch_names) <= set(outputs)
    ):
        raise ProtocolError(f"{what}: the cell's torch names must be a list of its -o names")
    torch_value = cell.get("torch_value", False)
    if not isinstance(torch_value, bool):
        raise ProtocolError(f"{what}: the cell's torch_value must be a boolean")
    inside = _torch_paths(cell.get("torch_inside", []), set(outputs), what)
    display = cell.get("display")
    if display is not None and not isinstance(display, dict):
        raise ProtocolError(f"{what}: the cell's display must be an object")
    from kcoral.remote import load_requested

    values = dict(outputs)
    values.update(load_requested(pickled, built.pickle_outputs, what=what))
    value = cell.get("value")
    if built.library == "torch":  # torch in, torch out: NumPy arrays made remotely too
        values = {name: to_torch_inside(item) for name, item in values.items()}
        value = to_torch_inside(value)
    elif built.library is None and (torch_names or torch_value or inside) and kernel_has_torch():
        values.update({name: to_torch(values[name]) for name in torch_names})
        value = to_torch(value) if torch_value else value
        values = {name: to_torch_at(item, inside, (name,)) for name, item in values.items()}
        value = to_torch_at(value, inside, (None,))
    files = {
        key.partition(":")[2]: item
        for key, item in result.results.items()
        if key.startswith((FILE_KEY_PREFIX, FOLDER_KEY_PREFIX))
    }
    shown = None
    if display is not None:
        from kcoral_jupyter.display import server_display

        shown = server_display(display)
        if "unsent" in cell:  # our wrapper says what was not carried with every display
            add_unsent_note(
                shown,
                cell["unsent"],
                pickled=built.serialization == "pickle",
                in_session=built.in_session,
            )
    return CellOutcome(
        outputs=values,
        has_value=bool(cell.get("has_value")),
        value=value,
        display=shown,
        files=files,
    )


def kernel_has_torch() -> bool:
    """Whether the kernel can import torch (without importing it: that costs seconds)."""
    if "torch" in sys.modules:
        return True
    import importlib.util

    return importlib.util.find_spec("torch") is not None


def to_torch(value: Any) -> Any:
    """A NumPy array as a torch tensor (bfloat16/float8 through a byte view); others as is."""
    numpy = sys.modules.get("numpy")
    if numpy is None or not isinstance(value, numpy.ndarray):
        return value
    import torch

    name = dtype_name_of_numpy(value.dtype)
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        raw = torch.from_numpy(numpy.ascontiguousarray(value).view(numpy.uint8))
        return raw.view(getattr(torch, name)).reshape(value.shape)
    return torch.from_numpy(value)


def to_torch_inside(value: Any) -> Any:
    """``value`` with every NumPy array in it, inside dicts and lists too, as torch."""
    if type(value) is dict:
        return {key: to_torch_inside(item) for key, item in value.items()}
    if type(value) is list:
        return [to_torch_inside(item) for item in value]
    return to_torch(value)


def to_torch_at(value: Any, paths: frozenset[tuple[Any, ...]], here: tuple[Any, ...]) -> Any:
    """``value`` (at path ``here``) with the NumPy arrays at ``paths`` made torch; a path
    that names no array changes nothing (the worst a lying server does is give torch for
    NumPy)."""
    if here in paths:
        return to_torch(value)
    if not any(path[: len(here)] == here for path in paths):
        return value
    if type(value) is dict:
        return {key: to_torch_at(item, paths, (*here, key)) for key, item in value.items()}
    if type(value) is list:
        return [to_torch_at(item, paths, (*here, index)) for index, item in enumerate(value)]
    return value


def _torch_paths(paths: Any, outputs: set[str], what: str) -> frozenset[tuple[Any, ...]]:
    """The record's ``torch_inside`` checked: paths of a ``-o`` name (or ``None``, the final
    value) and then keys and indexes, each the path of a torch tensor inside that value."""
    if not isinstance(paths, list) or not all(
        isinstance(path, list)
        and len(path) >= 2
        and (path[0] is None or path[0] in outputs)
        and all(type(step) in (str, int) for step in path[1:])
        for path in paths
    ):
        raise ProtocolError(
            f"{what}: the cell's torch_inside must be a list of paths into its values"
        )
    return frozenset(tuple(path) for path in paths)
